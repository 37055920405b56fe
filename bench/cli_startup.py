"""How long `clusterrun --help` takes, against a bare `python -c pass` measured in the same run.

    python bench/cli_startup.py [--repeat 20]

Target (DESIGN.md): `clusterrun --help` under 0.3 s on the reference 2-core machine.
Prints the median and the ratio to the interpreter's own start-up; exits 1 if the median
is over the target, so it can be watched from a shell loop.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

TARGET_S = 0.3


def timed(argv: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=60)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    script = shutil.which("clusterrun")
    cases = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        "python -m clusterrun --help": [sys.executable, "-m", "clusterrun", "--help"],
        "python -m clusterrun up --help": [sys.executable, "-m", "clusterrun", "up", "--help"],
    }
    if script:
        cases["clusterrun --help (console script)"] = [script, "--help"]
    results = {name: statistics.median(timed(argv, args.repeat)) for name, argv in cases.items()}
    base = results["python -c pass (baseline)"]
    for name, median in results.items():
        print(f"{name:40s} median {median * 1000:7.1f} ms   x{median / base:5.2f} of baseline")
    worst = max(v for k, v in results.items() if "--help" in k)
    verdict = "ok" if worst < TARGET_S else "OVER TARGET"
    print(f"slowest --help: {worst * 1000:.1f} ms (target < {TARGET_S * 1000:.0f} ms): {verdict}")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
