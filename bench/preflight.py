"""What the connectivity check before every launch costs: `up --preflight quick` against `--preflight off`.

    sudo python bench/preflight.py [--nodes 2,8,32] [--repeat 2]

One SimCluster of max(--nodes) nodes. For each N, runs of `clusterrun up` (nproc_per_node 1, a script that only
writes one line) with `--preflight off` and `--preflight quick`, interleaved. Measures, from the command's start,
the time until every node's agent had started torchrun (status.json "launched"), and the check's own duration
(preflight.json "seconds"). Target: small and flat in N. Prints a table; saves bench/results/preflight-<time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
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

SCRIPT = "import os\nprint('rank', os.environ['RANK'])\n"


def run(inv: Path, work: Path, mode: str, tag: str) -> dict:
    runs = work / f"runs-{tag}"
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "clusterrun", "up", "-q", "--preflight", mode, "--runs-dir",
                           str(runs), str(inv), str(work / "job.py")], cwd=work, env=clusterrun_env(),
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    out: dict = {"rc": done.returncode, "total_s": time.time() - t0}
    with contextlib.suppress(StopIteration, OSError, ValueError, KeyError, TypeError):
        run_dir = next(d for d in runs.iterdir() if d.is_dir())
        status = json.loads((run_dir / "status.json").read_text())
        out["launched_s"] = max(n["launched"] for n in status["nodes"].values()) - t0
        out["check_s"] = json.loads((run_dir / "preflight.json").read_text()).get("seconds")
    if done.returncode != 0:
        out["stderr"] = done.stderr[-1000:]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="2,8,32")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    counts = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    work = Path(tempfile.mkdtemp(prefix="clusterrun-bench-preflight-"))
    (work / "job.py").write_text(SCRIPT)
    result: dict = {"nodes": counts, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": {}}
    cluster = SimCluster(max(counts))
    try:
        cluster.start()
        for n in counts:
            inv = write_inventory(cluster, work / f"inv{n}.yaml", n, nproc=1)
            run(inv, work, "off", f"warm{n}")  # copies the script to the nodes' caches: not counted
            rows: dict[str, list[dict]] = {"off": [], "quick": []}
            for i in range(args.repeat):
                for mode in rows:
                    rows[mode].append(run(inv, work, mode, f"{mode}{n}-{i}"))
            result["runs"][n] = rows
            print(f"N={n:3d} " + "  ".join(f"{m}: launched {statistics.median(r.get('launched_s', float('nan')) for r in v):.2f} s"
                                           for m, v in rows.items()), flush=True)
    finally:
        cluster.stop()
    print()
    print(f"{'N':>4} | {'launched, off':>13} | {'launched, quick':>15} | {'added':>6} | {'ratio':>6} | {'check itself':>12}")
    summary = {}
    for n, rows in result["runs"].items():
        off = statistics.median(r.get("launched_s", float("nan")) for r in rows["off"])
        quick = statistics.median(r.get("launched_s", float("nan")) for r in rows["quick"])
        check = statistics.median(r.get("check_s") or float("nan") for r in rows["quick"])
        summary[n] = {"off_s": off, "quick_s": quick, "added_s": quick - off, "ratio": quick / off, "check_s": check}
        print(f"{n:>4} | {off:13.2f} | {quick:15.2f} | {quick - off:+6.2f} | {quick / off:5.2f}x | {check:12.2f}")
    result["summary"] = summary
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"preflight-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nsaved {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
