"""What a container adds to a launch: `clusterrun up` of the same job on the same simulated nodes, on the host and
inside an image (real podman with runc), alternating in the same run.

    sudo python bench/container.py [--nodes 2] [--nproc 2] [--repeat 3]

One SimCluster is started once (needs root, podman and runc: see tests/containerbed.py for how the image is made
without a registry and why runs need `--ulimit host` here). Each repeat runs the job twice, host first, then in
the image. Measured from the start of `clusterrun up`:

  ranks   until every rank ran its first line (each worker writes the time as its first statement, before it
          imports torch: what torchrun's start, the container's start and the rendezvous cost);
  total   until `clusterrun up` ended (the ready check in the image, the job, the removal of the containers).

The medians, their ratio (container / host) and the median of each back-to-back pair's ratio are printed and
saved to bench/results/container-<time>.json.
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

from benchlib import save_results  # noqa: E402
from containerbed import PodmanBed, container_inventory, give_cgroups, podman_missing  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simjobs import clusterrun_env, write_inventory  # noqa: E402

WORKER = """
import os, time
with open(os.path.join(os.environ["STAMPS"], os.environ["RANK"]), "w") as f:
    f.write(repr(time.time()))
import torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
"""


def one(inventory: Path, work: Path, label: str, world: int) -> dict:
    stamps = work / f"stamps-{label}-{time.monotonic_ns()}"
    stamps.mkdir()
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "clusterrun", "up", "-e", f"STAMPS={stamps}", str(inventory),
                           "worker.py"], cwd=work, env=clusterrun_env(), capture_output=True, text=True, timeout=600,
                          check=False)
    total = time.time() - started
    if done.returncode != 0:
        raise SystemExit(f"{label} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    times = [float(p.read_text()) for p in stamps.iterdir()]
    if len(times) != world:
        raise SystemExit(f"{label}: {len(times)} of {world} ranks wrote their time")
    return {"ranks": max(times) - started, "total": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    why = podman_missing()
    if why:
        raise SystemExit(why)
    work = Path(tempfile.mkdtemp(prefix="bench-container-"))
    (work / "worker.py").write_text(WORKER)
    results: dict[str, list[dict]] = {"host": [], "container": []}
    with SimCluster(args.nodes) as cluster:
        bed = PodmanBed(work)
        bed.import_image(bed.image)
        try:
            give_cgroups(cluster)
            host = write_inventory(cluster, work / "host.yaml", args.nodes, nproc=args.nproc)
            boxed = container_inventory(cluster, work / "container.yaml", bed, nodes=args.nodes, nproc=args.nproc,
                                        mounts=(f"{work}:{work}",))
            world = args.nodes * args.nproc
            for i in range(args.repeat):
                for label, inventory in (("host", host), ("container", boxed)):
                    got = one(inventory, work, label, world)
                    results[label].append(got)
                    print(f"repeat {i + 1} {label:9s} ranks {got['ranks']:6.2f}s  total {got['total']:6.2f}s",
                          flush=True)
        finally:
            bed.remove_all()
    summary = {label: {key: statistics.median(r[key] for r in runs) for key in ("ranks", "total")}
               for label, runs in results.items()}
    ratio = {key: summary["container"][key] / summary["host"][key] for key in ("ranks", "total")}
    # Each pair ran back to back: its ratio cancels the drift of a shared machine's load between pairs.
    both = list(zip(results["host"], results["container"], strict=True))
    pairs = {key: statistics.median(c[key] / h[key] for h, c in both) for key in ("ranks", "total")}
    print(f"\nmedian until every rank runs: host {summary['host']['ranks']:.2f}s, container "
          f"{summary['container']['ranks']:.2f}s, ratio {ratio['ranks']:.2f}")
    print(f"median until up ended:        host {summary['host']['total']:.2f}s, container "
          f"{summary['container']['total']:.2f}s, ratio {ratio['total']:.2f}")
    save_results({"nodes": args.nodes, "nproc": args.nproc, "runs": results, "median": summary, "ratio": ratio, "pair_ratio": pairs,
                  "machine": os.uname().nodename}, "container")
    print(f"median of the pairs' ratios:  ranks {pairs['ranks']:.2f}, total {pairs['total']:.2f}")
    print(json.dumps(ratio))


if __name__ == "__main__":
    main()
