"""All-reduce smoke test that ``clusterrun doctor`` launches on every node, the same way ``up`` launches jobs.

Every rank all-reduces a tensor of ones, checks the sum equals the world size, and times a few
iterations; rank 0 prints one line ``CLUSTERRUN-ALLREDUCE {json}`` with the algorithm and bus
bandwidth (busbw = algbw x 2(n-1)/n, as nccl-tests report it). NCCL on GPUs, gloo on CPUs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=16.0)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for init and each collective")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and dist.is_nccl_available()
    backend = "nccl" if cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    t0 = time.perf_counter()
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    init_s = time.perf_counter() - t0
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = max(1, int(args.mib * (1 << 20) / 4))
    tensor = torch.ones(numel, dtype=torch.float32, device=device)
    dist.all_reduce(tensor)  # warm-up, and the correctness check
    if cuda:
        torch.cuda.synchronize()
    got = float(tensor[0].item())
    if abs(got - world) > 1e-3 or abs(float(tensor[-1].item()) - world) > 1e-3:
        print(f"CLUSTERRUN-ALLREDUCE-WRONG rank {rank}: sum {got}, expected {world}", flush=True)
        return 3
    times = []
    for _ in range(args.iters):
        tensor.fill_(1.0)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    dist.barrier()
    if rank == 0:
        size = numel * 4
        best = min(times)
        algbw = size / best
        busbw = algbw * 2 * (world - 1) / world if world > 1 else algbw
        print("CLUSTERRUN-ALLREDUCE " + json.dumps({
            "backend": backend, "world_size": world, "bytes": size, "iters": args.iters, "init_s": init_s,
            "best_s": best, "median_s": sorted(times)[len(times) // 2], "algbw_gbps": algbw * 8 / 1e9,
            "busbw_gbps": busbw * 8 / 1e9, "torch": torch.__version__,
        }), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
