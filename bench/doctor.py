"""Doctor on the simulated cluster: wall time against node count, with a fault against without, and measured
bandwidth against shaped rates.

    sudo python bench/doctor.py [--nodes 1,8,32,64,128] [--repeat 1] [--detail] [--accuracy]

One SimCluster of max(--nodes, 4) nodes (management 200mbit, data 2gbit, tc tbf) is started once. Then:

  scaling: for each N, `clusterrun doctor INV --json` with the default checks (every check, the all-reduce
          included) on the first N nodes: its wall time, and the time of each of its steps (from its progress
          lines: the probe, each active check).
  fault:  on 4 nodes, the same doctor healthy, then with node2's data NIC dropping everything (iptables DROP:
          TCP connects hang, like a dead switch port): both wall times and their ratio, and whether the faulted
          report names node2 and its NIC.
  --detail: for each N also `--checks node` (the probe alone) and `--checks net.ping` (every node pinging
          all its peers at once), with a serial baseline (`ping` over ssh pair by pair) at N <= 4.
  --accuracy: on 4 nodes, `--checks net.bandwidth --bandwidth-rounds 0` with each data link shaped at 2gbit,
          then with node1's data link at 500mbit: each transfer against the shaped rate.

Every simulated node shares this machine's kernel, and with it one neighbour (ARP) table: the all-pairs
tests of 32 or more nodes need more entries than its default limit (gc_thresh3 = 1024; on a real cluster each
node has its own table). SimCluster raises the limit while a cluster is up and puts it back afterwards.
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
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import save_results  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simjobs import clusterrun_env, write_inventory  # noqa: E402

PREFIX = "clusterrun: doctor: "


def doctor(inv: Path, work: Path, *args: str) -> tuple[float, dict]:
    wall, report, _ = timed_doctor(inv, work, *args)
    return wall, report


def timed_doctor(inv: Path, work: Path, *args: str, timeout: float = 3600) -> tuple[float, dict, list[tuple[str, float]]]:
    """Wall time, the JSON report, and (step, seconds) for each progress line doctor printed (until the next)."""
    out = work / "doctor-out.json"
    marks: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    with open(out, "w+") as stdout:
        proc = subprocess.Popen([sys.executable, "-m", "clusterrun", "doctor", str(inv), "--json", *args], cwd=work,
                                stdout=stdout, stderr=subprocess.PIPE, text=True, env=clusterrun_env(),
                                stdin=subprocess.DEVNULL)
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # ends when doctor exits (its stderr closes)
                if line.startswith(PREFIX):
                    marks.append((time.perf_counter() - t0, line[len(PREFIX):].strip()))
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        wall = time.perf_counter() - t0
        stdout.seek(0)
        text = stdout.read()
    steps = [(m, (marks[i + 1][0] if i + 1 < len(marks) else wall) - t) for i, (t, m) in enumerate(marks)]
    try:
        return wall, json.loads(text), steps
    except ValueError:
        return wall, {"error": text[-2000:]}, steps


def phases(steps: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds per phase: the probe, then each check's title line with its rounds folded in."""
    out: dict[str, float] = {}
    current = "start"
    for step, secs in steps:
        if not step.startswith(("ping:", "bandwidth round", "all-reduce of", "RDMA round")):
            current = "probe" if step.startswith("probing") else step
        out[current] = out.get(current, 0.0) + secs
    return out


def problems(report: dict) -> list[str]:
    return [f"{c['name']}: {f['summary']}" for c in report.get("checks", []) for f in c.get("findings", [])
            if f.get("verdict") == "fail"]


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


def scaling(cluster: SimCluster, work: Path, counts: list[int], repeat: int, detail: bool) -> dict:
    out: dict = {}
    for n in counts:
        inv = write_inventory(cluster, work / f"inv{n}.yaml", n, nproc=1)
        rows = []
        for _ in range(repeat):
            wall, report, steps = timed_doctor(inv, work)
            rows.append({"wall_s": wall, "verdict": report.get("verdict"), "phases": phases(steps),
                         "failures": problems(report)})
        best = min(rows, key=lambda r: r["wall_s"])
        entry = {"wall_s": statistics.median(r["wall_s"] for r in rows), "verdicts": [r["verdict"] for r in rows],
                 "phases": best["phases"], "failures": best["failures"][:10],
                 "rounds": (n - 1 if n % 2 == 0 else n) if n > 1 else 0}
        if detail:
            probe_s, _ = doctor(inv, work, "--checks", "node")
            ping_s, ping_report = doctor(inv, work, "--checks", "net.ping")
            entry.update(probe_s=probe_s, ping_s=ping_s, ping_verdict=ping_report.get("verdict"),
                         pings=n * (n - 1) * 2)
            if 1 < n <= 4:
                serial_s, pings = serial_pings(cluster, n)
                entry["serial_per_ping_s"] = serial_s / pings
        out[n] = entry
        steps_text = ", ".join(f"{k} {v:.1f}" for k, v in entry["phases"].items())
        print(f"N={n:3d} doctor {entry['wall_s']:7.2f} s  verdict {'/'.join(map(str, entry['verdicts']))}  "
              f"({steps_text})", flush=True)
        for f in entry["failures"][:3]:
            print(f"        fail {f[:160]}", flush=True)
    return out


def fault(cluster: SimCluster, work: Path, repeat: int) -> dict:
    """Doctor on 4 nodes healthy, then with node2's data NIC dropping everything."""
    inv = write_inventory(cluster, work / "fault4.yaml", 4, nproc=1)
    healthy, faulted, named = [], [], []
    nic = cluster.nodes[2].data_nic
    for _ in range(repeat):
        wall, report, steps = timed_doctor(inv, work)
        healthy.append((wall, report.get("verdict"), phases(steps)))
        cluster.drop_nic("node2", "data")
        try:
            wall, report, steps = timed_doctor(inv, work)
        finally:
            cluster.reset()
        faulted.append((wall, report.get("verdict"), phases(steps)))
        named.append([f for f in problems(report) if f.startswith("net.ping: node2: ") and nic in f])
    h = statistics.median(w for w, _, _ in healthy)
    f = statistics.median(w for w, _, _ in faulted)
    result = {"healthy_s": h, "faulted_s": f, "ratio": f / h, "healthy_verdicts": [v for _, v, _ in healthy],
              "faulted_verdicts": [v for _, v, _ in faulted], "healthy_phases": healthy[0][2],
              "faulted_phases": faulted[0][2], "fault_named": all(named), "fault_findings": named[0]}
    print(f"fault, 4 nodes: healthy {h:.2f} s, node2's data NIC dropped {f:.2f} s: {f / h:.2f}x "
          f"(bound 2x); the fault named: {result['fault_named']}", flush=True)
    for label, key in (("healthy", "healthy_phases"), ("faulted", "faulted_phases")):
        print(f"  {label}: " + ", ".join(f"{k} {v:.1f}" for k, v in result[key].items()), flush=True)
    return result


def accuracy(cluster: SimCluster, work: Path) -> dict:
    inv4 = write_inventory(cluster, work / "bw4.yaml", 4, nproc=1)
    _, even = doctor(inv4, work, "--checks", "net.bandwidth", "--bandwidth-rounds", "0")
    cluster.shape("node1", "data", "500mbit")
    try:
        _, slow = doctor(inv4, work, "--checks", "net.bandwidth", "--bandwidth-rounds", "0")
    finally:
        cluster.reset()
    bw = {"all_2gbit": transfers(even), "node1_500mbit": transfers(slow),
          "slow_findings": [f["summary"] for f in check(slow, "net.bandwidth").get("findings", [])
                            if f["verdict"] != "pass"]}

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
    return bw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1,8,32,64,128", help="node counts, comma-separated (at most 240)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measure (the median is reported)")
    parser.add_argument("--no-fault", dest="fault", action="store_false", help="skip the 4-node fault comparison")
    parser.add_argument("--detail", action="store_true", help="also time the probe and the ping check alone")
    parser.add_argument("--accuracy", action="store_true", help="also compare measured bandwidth with shaped rates")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    counts = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    size = max(max(counts), 4)
    result: dict = {"nodes": counts, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(),
                    "load_before": os.getloadavg()}
    work = Path(tempfile.mkdtemp(prefix="clusterrun-bench-doctor-"))
    cluster = SimCluster(size)
    try:
        cluster.start()
        if args.fault:
            result["fault"] = fault(cluster, work, args.repeat)
        result["scaling"] = scaling(cluster, work, counts, args.repeat, args.detail)
        if args.accuracy:
            result["bandwidth"] = accuracy(cluster, work)
    finally:
        cluster.stop()
    result["load_after"] = os.getloadavg()
    print("\ndoctor wall time, default checks (seconds)")
    print(f"{'N':>4} | {'doctor':>8} | {'verdict':>7} | {'rounds':>6} | where the time went")
    for n, e in result["scaling"].items():
        top = sorted(e["phases"].items(), key=lambda kv: -kv[1])[:3]
        print(f"{n:>4} | {e['wall_s']:8.2f} | {e['verdicts'][0]!s:>7} | {e['rounds']:>6} | "
              + ", ".join(f"{k[:40]} {v:.1f}" for k, v in top))
    if "fault" in result:
        fr = result["fault"]
        print(f"\n4 nodes: healthy {fr['healthy_s']:.2f} s, faulted {fr['faulted_s']:.2f} s, ratio {fr['ratio']:.2f}")
    print(f"load average before {result['load_before'][0]:.1f}, after {result['load_after'][0]:.1f} "
          f"({result['cpus']} CPUs): concurrent load on this machine disturbs these figures")
    save_results(result, "doctor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
