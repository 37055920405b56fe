"""Screenshots of the HTML pages, for a person to look at, and their sizes.

    sudo python bench/screenshots.py [--out DIR] [--nodes-for-size 128]

On a 4-node SimCluster (needs root, see tests/simcluster.py): a doctor round with node2's data NIC dropping
everything, a 4x2 run whose rank 5 fails, and a run restarted once after a failure. Each one's report.html is
shown in headless chromium and saved as a PNG in --out (default bench/results/screenshots/), beside a copy of
the page. Then the size of a doctor page and a run page of --nodes-for-size nodes (made-up records of that
size, no cluster needed): the pages must stay small (a few MB) at 128 nodes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from benchlib import save_results  # noqa: E402
from browser import screenshot  # noqa: E402
from report_scenarios import FAILING_JOB, RESTARTED_JOB, big_doctor_round, big_run  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simjobs import run_clusterrun, write_inventory  # noqa: E402

from clusterrun.report import write_doctor_page, write_run_page  # noqa: E402


def _only(runs: Path, prefix: str = "") -> Path:
    found = sorted(p for p in runs.iterdir() if p.is_dir() and p.name.startswith(prefix))
    return found[-1]


def _shoot(page: Path, out: Path, name: str, height: int) -> dict:
    shutil.copy(page, out / f"{name}.html")
    png = screenshot(page, out / f"{name}.png", height=height)
    return {"page": name, "bytes": page.stat().st_size, "png": str(png)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "screenshots")
    ap.add_argument("--nodes-for-size", type=int, default=128)
    ap.add_argument("--no-cluster", action="store_true", help="only the page sizes")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"pages": [], "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="clusterrun-pages-") as tmp:
        work = Path(tmp)
        if not args.no_cluster:
            cluster = SimCluster(4)
            cluster.start()
            try:
                inv = write_inventory(cluster, work / "cluster.yaml", 4, nproc=2)
                cluster.drop_nic("node2", "data")
                done = run_clusterrun("doctor", str(inv), "--checks", "node,net", "--bandwidth-seconds", "1",
                                      cwd=work, timeout=300)
                print(done.stdout.splitlines()[-1] if done.stdout else done.stderr[-500:])
                cluster.restore_nic("node2", "data")
                result["pages"].append(_shoot(_only(work / "runs", "doctor-") / "report.html", args.out, "doctor",
                                              2600))
                (work / "fail.py").write_text(FAILING_JOB)
                run_clusterrun("up", str(inv), "fail.py", cwd=work, timeout=240)
                result["pages"].append(_shoot(_only(work / "runs", "2") / "report.html", args.out, "run-failed",
                                              2200))
                inv2 = write_inventory(cluster, work / "two.yaml", 2, nproc=1)
                (work / "restart.py").write_text(RESTARTED_JOB)
                run_clusterrun("up", "--max-restarts", "1", "--restart-backoff", "0.5", str(inv2), "restart.py",
                               cwd=work, timeout=240)
                result["pages"].append(_shoot(_only(work / "runs", "2") / "report.html", args.out, "run-restarted",
                                              1800))
            finally:
                cluster.stop()
        n = args.nodes_for_size
        t0 = time.perf_counter()
        page = write_doctor_page(big_doctor_round(work / "big-doctor", n))
        result["sizes"][f"doctor-{n}"] = {"bytes": page.stat().st_size, "seconds": time.perf_counter() - t0}
        t0 = time.perf_counter()
        page = write_run_page(big_run(work / "big-run", n, 8))
        result["sizes"][f"run-{n}x8"] = {"bytes": page.stat().st_size, "seconds": time.perf_counter() - t0}
    print(json.dumps(result, indent=2))
    save_results(result, "screenshots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
