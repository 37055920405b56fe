"""Run a command on a busy machine: a bounded CPU hog beside it, and the load average it saw.

    python bench/busy.py --procs 8 --nice 10 -- python -m pytest -q

``--procs`` processes spin (each a busy loop at ``--nice``) for as long as the command runs, at most ``--minutes``;
every ``--every`` seconds the 1-minute load average is sampled. At the end: the command's exit code (this
script's own), its wall time, and the load's minimum, median and maximum over the run (the first three minutes left
out: the 1-minute average climbs to within 5 % of the load in three), also written as JSON with ``--json FILE``, with
every sample. The hog stops with the command,
at the time bound, or on Ctrl-C; the command is never killed by it, only its hog.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time

#: Seconds before the load average is counted: an exponential average over a minute, it is within 5 % of the
#: load after three.
SETTLE = 180.0


def _spin(nice: int, until: float) -> None:
    os.nice(nice)
    while time.monotonic() < until:  # bounded: the hog ends by itself at the time bound
        for _ in range(100_000):
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, default=8, help="busy processes (default 8)")
    parser.add_argument("--nice", type=int, default=10, help="their nice level (default 10)")
    parser.add_argument("--minutes", type=float, default=120.0, help="the hog's time bound (default 120)")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between load samples (default 15)")
    parser.add_argument("--json", metavar="FILE", help="write the figures here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if not 1 <= args.procs <= 64:
        parser.error("--procs: between 1 and 64")
    start = time.monotonic()
    until = start + args.minutes * 60
    hogs = []
    for _ in range(args.procs):
        pid = os.fork()
        if pid == 0:
            try:
                _spin(args.nice, until)
            finally:
                os._exit(0)
        hogs.append(pid)
    samples: list[tuple[float, float]] = []
    # SIGINT as a terminal gives it, even where this script was started with it ignored (a background job of a
    # shell without job control): ignored, it would stay ignored in the command and its children.
    proc = subprocess.Popen(command, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while True:
            try:
                code = proc.wait(timeout=args.every)
                break
            except subprocess.TimeoutExpired:
                samples.append((time.monotonic() - start, os.getloadavg()[0]))
    except KeyboardInterrupt:
        code = proc.wait()
    finally:
        for pid in hogs:  # only the processes this script started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    wall = time.monotonic() - start
    loads = [load for at, load in samples if at >= SETTLE] or [load for _, load in samples]
    figures = {"command": command, "exit_code": code, "wall_s": round(wall, 1), "procs": args.procs,
               "nice": args.nice, "load_samples": len(loads),
               "load_min": round(min(loads), 2) if loads else None,
               "load_median": round(statistics.median(loads), 2) if loads else None,
               "load_max": round(max(loads), 2) if loads else None,
               "samples": [(round(at, 1), round(load, 2)) for at, load in samples]}
    print(f"busy.py: exit {code} after {wall / 60:.1f} min beside {args.procs} busy processes at nice {args.nice}; "
          f"1-minute load average min {figures['load_min']}, median {figures['load_median']}, "
          f"max {figures['load_max']} ({len(loads)} samples)", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=2)
    return code


if __name__ == "__main__":
    sys.exit(main())
