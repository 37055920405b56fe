"""What torch's flight recorder costs a training step: collectives per second with and without it.

    python bench/flight.py [--ops 3000] [--repeat 5] [--elements 1024]

``--hang-timeout`` turns the recorder on in every worker (``TORCH_FR_BUFFER_SIZE=2000``, as clusterrun sets
it). This runs the same loop of small gloo all-reduces under torchrun, 2 ranks on this machine, alternately
with the recorder off and on, and reports the median time per all-reduce of each and their ratio. Small
tensors make the per-collective bookkeeping as visible as it can be; a real step's collectives are larger.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import save_results

LOOP = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(int(sys.argv[2]))
for _ in range(200):
    dist.all_reduce(t)
dist.barrier()
start = time.perf_counter()
for _ in range(int(sys.argv[1])):
    dist.all_reduce(t)
took = time.perf_counter() - start
if dist.get_rank() == 0:
    print("TOOK", took / int(sys.argv[1]), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def one(script: str, ops: int, elements: int, recorder: bool, port: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_TRACE"))}
    if recorder:
        env["TORCH_FR_BUFFER_SIZE"] = "2000"
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(port), script, str(ops), str(elements)], env=env, capture_output=True, text=True,
                         timeout=600, check=True, stdin=subprocess.DEVNULL).stdout
    return next(float(line.split()[1]) for line in out.splitlines() if line.startswith("TOOK"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--elements", type=int, default=1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "loop.py")
        Path(script).write_text(LOOP)
        off, on = [], []
        for i in range(args.repeat):
            off.append(one(script, args.ops, args.elements, False, 29650 + 2 * i))
            on.append(one(script, args.ops, args.elements, True, 29651 + 2 * i))
            print(f"round {i + 1}: off {off[-1] * 1e6:.1f} us/op, on {on[-1] * 1e6:.1f} us/op", flush=True)
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"\nall_reduce of {args.elements} floats, 2 ranks, {args.ops} ops x {args.repeat}:")
    print(f"  recorder off {m_off * 1e6:.1f} us/op, on {m_on * 1e6:.1f} us/op: {m_on / m_off:.3f}x")
    save_results({"ops": args.ops, "repeat": args.repeat, "elements": args.elements, "off_s": off, "on_s": on,
                  "ratio": m_on / m_off}, "flight")
    print(json.dumps({"ratio": round(m_on / m_off, 3)}))


if __name__ == "__main__":
    main()
