"""The size of one node's series over a week at one sample a second (clusterrun/runs/series.py).

    python bench/series_size.py [--days 7]

Writes a full node's samples (tests/test_series.py ``typical``: 8 GPUs, 8 ranks, 4 NICs, 2 RDMA ports, the ranks'
connections to 3 peers; about 1.4 kB each) a minute at a time into a fresh directory, as the supervisor would,
and prints the series' size after the first hour, the first day and the end, each file's size and lines, and
the CPU it took (time.process_time). The directory is removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_series import typical  # noqa: E402

from clusterrun.runs import series  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=float, default=7.0)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="series-size-"))
    try:
        writer = series.SeriesWriter(folder)
        started, batch = time.process_time(), []
        for i in range(int(args.days * 86400)):
            batch.append(typical(1.8e9 + i, i))
            if len(batch) == 60:
                writer.extend("n", batch)
                batch = []
            if i + 1 in (3600, 86400):
                print(f"after {(i + 1) // 3600} h: {series.size(folder, 'n') / 1e6:.2f} MB", flush=True)
        writer.extend("n", batch)
        print(f"after {args.days:g} days: {series.size(folder, 'n') / 1e6:.2f} MB, "
              f"{time.process_time() - started:.0f} s of CPU")
        for path in sorted((folder / "n").iterdir()):
            print(f"  {path.name}: {path.stat().st_size / 1e6:.2f} MB, {path.read_text().count(chr(10))} lines")
    finally:
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
