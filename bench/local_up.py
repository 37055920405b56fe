"""Wall time of `clusterrun up` on the local inventory, against plain `torchrun` running the same job.

    python bench/local_up.py [--repeat 3] [--script examples/train_ddp.py] [-- script args]

Both run 2 CPU ranks (gloo) of the same script with the same arguments; the ratio is
clusterrun's overhead (plan, node agent, log streaming, run directory) over torchrun alone.
Run directories go to a temporary folder that is removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(argv: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600,
                   stdin=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--script", default=str(ROOT / "examples" / "train_ddp.py"))
    parser.add_argument("script_args", nargs="*", default=["--epochs", "1"])
    args = parser.parse_args()
    script = os.path.abspath(args.script)
    with tempfile.TemporaryDirectory(prefix="clusterrun-bench-") as tmp:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    script, *args.script_args]
        ours = [sys.executable, "-m", "clusterrun", "up", str(ROOT / "inventories" / "localhost.yaml"), script,
                *args.script_args]
        rows = {"torchrun --standalone (baseline)": [], "clusterrun up localhost.yaml": []}
        for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits both alike
            rows["torchrun --standalone (baseline)"].append(timed(torchrun, tmp))
            rows["clusterrun up localhost.yaml"].append(timed(ours, tmp))
    base = statistics.median(rows["torchrun --standalone (baseline)"])
    print(f"job: {os.path.relpath(script, ROOT)} {' '.join(args.script_args)}, 2 CPU ranks, {args.repeat} runs each")
    for name, times in rows.items():
        median = statistics.median(times)
        print(f"{name:34s} median {median:6.2f} s   x{median / base:4.2f}   (+{median - base:5.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
