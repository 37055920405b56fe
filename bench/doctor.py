"""Doctor on the simulated cluster: wall time against node count, and measured bandwidth against shaped rates.

    sudo python bench/doctor.py [--nodes 2,4,8,16] [--repeat 1]

One SimCluster of max(--nodes) nodes (management 200mbit, data 2gbit, tc tbf) is started once. For each N:

  probe:  `clusterrun doctor INV --checks node` (one probe round trip per node, in parallel)
  ping:   `clusterrun doctor INV --checks net.ping`: every pair, both ways, on both networks, as a round-robin
          tournament. Its time minus the probe time, divided by the rounds (N-1, or N for odd N), is the cost of
          one round; the same pings one after the other would take N(N-1) x 2 networks pings. A serial baseline,
          `ping` run over ssh pair by pair, is measured in the same run at N <= 4 and scaled per ping.
  full:   `clusterrun doctor INV --skip cluster.allreduce` (every check but the all-reduce)

Then, on 4 nodes, `--checks net.bandwidth --bandwidth-rounds 0` measures every pair both ways with each data link
shaped at 2gbit, then with node1's data link shaped at 500mbit: each transfer is compared with the shaped rate.
Results are printed and saved to bench/results/doctor-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from simcluster import SimCluster  # noqa: E402
from simjobs import clusterrun_env, write_inventory  # noqa: E402


def doctor(inv: Path, work: Path, *args: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "clusterrun", "doctor", str(inv), "--json", *args], cwd=work,
                          capture_output=True, text=True, env=clusterrun_env(), timeout=900, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    try:
        return wall, json.loads(done.stdout)
    except ValueError:
        return wall, {"error": done.stderr[-2000:]}


def serial_pings(cluster: SimCluster, n: int) -> tuple[float, int]:
    """Every ordered pair, on the data network, one `ssh nodeA ping -c 3 ...` after the other."""
    count = 0
    t0 = time.perf_counter()
    for a in cluster.nodes[:n]:
        for b in cluster.nodes[:n]:
            if a is b:
                continue
            subprocess.run(["ssh", "-F", str(cluster.ssh_config), a.name, f"ping -n -c 3 -i 0.2 -W 1 {b.data_ip}"],
                           capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
            count += 1
    return time.perf_counter() - t0, count


def check(report: dict, name: str) -> dict:
    return next((c for c in report.get("checks", []) if c["name"] == name), {})


def transfers(report: dict) -> list[dict]:
    for f in check(report, "net.bandwidth").get("findings", []):
        if f.get("data", {}).get("transfers"):
            return f["data"]["transfers"]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="2,4,8,16")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    counts = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    size = max(max(counts), 4)
    result: dict = {"nodes": counts, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "scaling": {}}
    work = Path(tempfile.mkdtemp(prefix="clusterrun-bench-doctor-"))
    cluster = SimCluster(size)
    try:
        cluster.start()
        for n in counts:
            inv = write_inventory(cluster, work / f"inv{n}.yaml", n, nproc=1)
            rows = []
            for _ in range(args.repeat):
                probe_s, _ = doctor(inv, work, "--checks", "node")
                ping_s, ping_report = doctor(inv, work, "--checks", "net.ping")
                full_s, full_report = doctor(inv, work, "--skip", "cluster.allreduce", "--bandwidth-seconds", "1")
                rows.append({"probe_s": probe_s, "ping_s": ping_s, "full_s": full_s,
                             "ping_verdict": ping_report.get("verdict"), "full_verdict": full_report.get("verdict")})
            rounds = n - 1 if n % 2 == 0 else n
            entry = {k: statistics.median(r[k] for r in rows) for k in ("probe_s", "ping_s", "full_s")}
            entry.update(rounds=rounds, pings=n * (n - 1) * 2, verdicts=[r["ping_verdict"] for r in rows])
            entry["per_round_s"] = (entry["ping_s"] - entry["probe_s"]) / rounds
            if n <= 4:
                serial_s, pings = serial_pings(cluster, n)
                entry["serial_per_ping_s"] = serial_s / pings
            result["scaling"][n] = entry
            print(f"N={n:3d} probe {entry['probe_s']:6.2f} s  ping {entry['ping_s']:6.2f} s ({rounds} rounds, "
                  f"{entry['per_round_s']:.2f} s/round)  full {entry['full_s']:6.2f} s", flush=True)
        inv4 = write_inventory(cluster, work / "bw4.yaml", 4, nproc=1)
        _, even = doctor(inv4, work, "--checks", "net.bandwidth", "--bandwidth-rounds", "0")
        cluster.shape("node1", "data", "500mbit")
        _, slow = doctor(inv4, work, "--checks", "net.bandwidth", "--bandwidth-rounds", "0")
        cluster.reset()
        result["bandwidth"] = {"all_2gbit": transfers(even), "node1_500mbit": transfers(slow),
                               "slow_findings": [f["summary"] for f in check(slow, "net.bandwidth").get("findings", [])
                                                 if f["verdict"] != "pass"]}
    finally:
        cluster.stop()
    per_ping = statistics.median(e["serial_per_ping_s"] for e in result["scaling"].values() if "serial_per_ping_s" in e)
    print()
    print("doctor wall time (seconds)")
    print(f"{'N':>4} | {'probe':>6} | {'net.ping':>8} | {'rounds':>6} | {'s/round':>7} | {'serial est.':>11} | "
          f"{'serial / ours':>13} | {'all but all-reduce':>18}")
    for n, e in result["scaling"].items():
        serial = per_ping * e["pings"]
        ours = e["ping_s"] - e["probe_s"]
        print(f"{n:>4} | {e['probe_s']:6.2f} | {e['ping_s']:8.2f} | {e['rounds']:>6} | {e['per_round_s']:7.2f} | "
              f"{serial:11.1f} | {serial / ours if ours > 0 else float('nan'):12.1f}x | {e['full_s']:18.2f}")
    print(f"(serial estimate: {per_ping:.2f} s per ssh+ping measured here, times N(N-1) x 2 networks)")
    bw = result["bandwidth"]

    def report(label: str, rows: list[dict], expect: dict[tuple[str, str], float]) -> None:
        print(f"\nbandwidth, {label}:")
        for t in rows:
            want = expect.get((t["src"], t["dst"]), 2e9)
            print(f"  {t['src']}->{t['dst']}: {t['bps'] / 1e6:7.0f} Mbit/s, shaped {want / 1e6:.0f}: "
                  f"{t['bps'] / want - 1:+.1%}")
    report("every data link shaped at 2gbit", bw["all_2gbit"], {})
    report("node1's data link shaped at 500mbit (its sends)", bw["node1_500mbit"],
           {(t["src"], t["dst"]): 5e8 for t in bw["node1_500mbit"] if t["src"] == "node1"})
    for s in bw["slow_findings"]:
        print(f"  finding: {s}")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"doctor-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nsaved {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
