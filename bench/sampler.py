"""The node's sampler (clusterrun/remote/sampler.py): its CPU per sample on this machine, against /proc and /sys.

    python bench/sampler.py [--ranks 8] [--fds 300] [--samples 200] [--every 0.05] [--smi PATH --gpus 0,1]

Starts --ranks sleeping Python processes as a job's workers would look to the sampler (LOCAL_RANK in their
environment, --fds open files each, as CUDA leaves a worker, and two TCP connections each to a server on
127.0.0.1), then runs the sampler in this process every --every seconds for --samples samples (one uncounted
before them: the counters' first readings, each rank's whole fd table). Its CPU is the time this process's
threads ran, from /proc/self/task/*/schedstat (nanoseconds; /proc/self/stat's clock ticks are too coarse for
a few ms), between the first and the last sample, plus, with --smi, that of the looping nvidia-smi child (its
/proc/<pid>/schedstat, read before it is stopped). Reported: CPU per sample in ms, which at one sample a second
is the CPU per second. The workers are killed by PID at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clusterrun.remote import sampler  # noqa: E402

WORKER = """
import os, socket, sys, time
files = [open(os.devnull) for _ in range(int(sys.argv[1]))]
conns = [socket.create_connection(("127.0.0.1", int(sys.argv[2]))) for _ in range(2)]
print("ready", flush=True)
time.sleep(3600)
"""


def cpu_of(pid: int | str = "self") -> float:
    """Seconds the threads of ``pid`` ran on a CPU (/proc/<pid>/task/*/schedstat, first field: ns)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except OSError:
            continue  # a thread that ended meanwhile
    return total / 1e9


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--fds", type=int, default=300)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--every", type=float, default=0.05)
    parser.add_argument("--smi", default="")
    parser.add_argument("--gpus", default="")
    args = parser.parse_args()
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: [accepted.append(server.accept()[0]) for _ in range(2 * args.ranks)],
                     daemon=True).start()
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(args.fds), str(server.getsockname()[1])],
                                env=dict(os.environ, LOCAL_RANK=str(r)), stdout=subprocess.PIPE, text=True)
               for r in range(args.ranks)]
    try:
        for w in workers:
            assert w.stdout is not None and w.stdout.readline().strip() == "ready"
        ranks = {r: w.pid for r, w in enumerate(workers)}
        gpus = [int(g) for g in args.gpus.split(",") if g]
        s = sampler.Sampler(lambda: ranks, gpus, smi=args.smi or "", every=args.every, apps_every=10.0)
        if s.gpu is not None:
            s.gpu.start()
        s.sample()
        time.sleep(args.every)
        before, started = cpu_of(), time.monotonic()
        last = {}
        for _ in range(args.samples):
            last = s.sample()
            time.sleep(args.every)
        used = cpu_of() - before
        smi = cpu_of(s.gpu.proc.pid) if s.gpu is not None and s.gpu.proc is not None else 0.0
        took = time.monotonic() - started
        if s.gpu is not None:
            s.gpu.close()
        print(f"{args.samples} samples in {took:.1f} s, {args.ranks} ranks x {args.fds} fds, "
              f"{len(last.get('nics', {}))} NICs: sampler {1000 * used / args.samples:.3f} ms CPU per sample"
              + (f", nvidia-smi {1000 * smi / took:.3f} ms CPU per second of its loop" if smi else ""))
        print("last sample:", {k: (v if k not in ("ranks", "conns") else f"{len(v)} entries") for k, v in last.items()})
    finally:
        for w in workers:
            w.kill()
            w.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
