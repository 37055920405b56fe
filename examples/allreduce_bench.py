"""Measure all-reduce bandwidth across every rank of a job, in the style of nccl-tests' all_reduce_perf.

Start it on one machine, or on every node with clusterrun:

    torchrun --nproc-per-node 2 examples/allreduce_bench.py
    clusterrun up inventory.yaml examples/allreduce_bench.py -- --max-bytes 1G

Each rank all-reduces (sums) a tensor of every size in a sweep, on the GPU with
NCCL when CUDA is available, else on the CPU with gloo. Rank 0 prints a table:

    size(B)  count  type  time(us)  algbw(GB/s)  busbw(GB/s)  check

algbw is bytes / time. busbw (bus bandwidth) corrects it for the number of
ranks so that it can be compared with the speed of the slowest link (NVLink,
PCIe, the NIC): if busbw on large sizes is far below the link's rated speed,
the job is using the wrong network (check NCCL_SOCKET_IFNAME, NCCL_IB_HCA) or a
slow path inside the node (nvidia-smi topo -m).

Every size is also checked: each rank contributes rank+1, so every element of
the result must be 1 + 2 + ... + n = n(n+1)/2. A wrong result is an error and
makes every rank exit with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from dataclasses import asdict, dataclass
from typing import TextIO

import torch
import torch.distributed as dist

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
# Binary units, as nccl-tests reads -b/-e: "64M" is 64 x 2**20 bytes.
UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}
SIZE_PATTERN = re.compile(r"(\d+)\s*(?:([kmg])(?:i?b)?|b)?", re.IGNORECASE)
# The CPU (gloo) default stops earlier: 64M over TCP loopback takes long enough
# to make the default run slow without saying more about the machine.
DEFAULT_MAX_BYTES = {"cuda": 64 * 2**20, "cpu": 16 * 2**20}


@dataclass(frozen=True)
class Worker:
    """Who this process is in the job, and where it computes."""

    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: torch.device


def emit(text: str, file: TextIO | None = None) -> None:
    """Write text and its newline in a single write, then flush.

    The ranks of a node share one output stream. print() writes the text and
    the newline separately when Python runs unbuffered (PYTHONUNBUFFERED=1, as
    many container images set), so another rank's line can land in between
    and a launcher sees two lines glued together. One write per line keeps
    lines whole; flushing at once shows each line when it happens, not when a
    buffer fills.
    """
    stream = sys.stdout if file is None else file
    stream.write(text + "\n")
    stream.flush()


@dataclass(frozen=True)
class Result:
    """One row of the table: the timing of one message size (time is the mean per all-reduce)."""

    size_bytes: int
    count: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    correct: bool


def parse_size(text: str) -> int:
    """Return the number of bytes in a size such as "4096", "512B", "1K", "64M", "1GiB" (binary units).

    Raises ValueError when the text is not such a size or is zero.
    """
    match = SIZE_PATTERN.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a size: {text!r}; write a byte count with an optional unit, like 4096, 1K, 64M or 1G")
    number, unit = match.groups()
    size = int(number) * UNITS[(unit or "").lower()]
    if size == 0:
        raise ValueError(f"size must be at least 1 byte, got {text!r}")
    return size


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """Return the bus bandwidth of an all-reduce that ran at algbw (same unit) over world_size ranks.

    A ring all-reduce moves the data in two passes around the ring: a
    reduce-scatter, then an all-gather, each taking n-1 steps that send 1/n of
    the data. So every rank sends (and receives) 2(n-1)/n times the buffer size,
    whatever n is, and that traffic is what the links carry. Scaling algbw by
    2(n-1)/n gives a number comparable across world sizes and with the links'
    hardware speed. With one rank nothing crosses a link, so it is 0.
    """
    return algbw * 2 * (world_size - 1) / world_size


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int, element_size: int) -> list[int]:
    """Return the message sizes in bytes from min_bytes, multiplied by factor, up to max_bytes.

    Each size is rounded down to whole elements (at least one element).
    """
    sizes: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        rounded = max(element_size, size - size % element_size)
        if not sizes or rounded != sizes[-1]:
            sizes.append(rounded)
        size *= factor
    return sizes


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=_size_arg, default=1024, help="smallest message (default: 1K)")
    parser.add_argument(
        "--max-bytes",
        type=_size_arg,
        default=None,
        help="largest message (default: 64M on GPU, 16M on CPU)",
    )
    parser.add_argument("--factor", type=int, default=2, help="multiply the size by this each step (default: 2)")
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces per size (default: 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size first (default: 5)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="element type (default: float32)")
    parser.add_argument(
        "--backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help="collective backend; auto picks nccl when CUDA is available, else gloo (default: auto)",
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON (rank 0)")
    args = parser.parse_args(argv)
    if args.factor < 2:
        parser.error(f"--factor must be at least 2, got {args.factor}")
    if args.iters < 1:
        parser.error(f"--iters must be at least 1, got {args.iters}")
    if args.warmup < 0:
        parser.error(f"--warmup must not be negative, got {args.warmup}")
    return args


def choose_backend(requested: str, local_rank: int) -> tuple[str, torch.device]:
    """Return the backend and device for this process, or exit explaining why there is no GPU for it.

    Every rank must pick the same backend: mixed GPU/CPU clusters pass --backend.
    """
    if requested == "gloo" or (requested == "auto" and not torch.cuda.is_available()):
        return "gloo", torch.device("cpu")
    # NCCL works on CUDA tensors, one GPU per process, chosen by LOCAL_RANK among
    # the GPUs this process sees (after CUDA_VISIBLE_DEVICES).
    visible = torch.cuda.device_count()
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    if visible == 0:
        raise SystemExit(
            f"error: backend nccl needs a GPU but CUDA sees none (CUDA_VISIBLE_DEVICES={cuda_visible}); "
            "pass --backend gloo to measure on CPU"
        )
    if local_rank >= visible:
        raise SystemExit(
            f"error: local_rank {local_rank} has no GPU: this node sees {visible} "
            f"(CUDA_VISIBLE_DEVICES={cuda_visible}); start at most {visible} processes per node "
            f"(--nproc-per-node {visible}) or pass --backend gloo"
        )
    return "nccl", torch.device("cuda", local_rank)


def init_distributed(backend: str, device: torch.device) -> Worker:
    """Join the process group that torchrun set up (or a one-process group without torchrun)."""
    if "RANK" in os.environ:
        if device.type == "cuda":
            # Bind to this rank's GPU before NCCL creates its communicator there.
            torch.cuda.set_device(device)
        # init_method "env://": MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE come
        # from torchrun; this waits until every rank has connected.
        dist.init_process_group(backend=backend)
        return Worker(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), dist.get_world_size(), backend, device)
    emit(
        "note: RANK is not set, so this was not started by torchrun; running as a single process "
        "(world size 1, bus bandwidth 0). To measure links: torchrun --nproc-per-node 2 " + sys.argv[0],
        file=sys.stderr,
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return Worker(0, 0, 1, backend, device)


def synchronize(worker: Worker) -> None:
    """Wait until this rank's queued GPU work is done and every rank has reached this point."""
    if worker.device.type == "cuda":
        # NCCL calls only enqueue work on the GPU and return at once; without
        # this the clock would stop before the data has moved.
        torch.cuda.synchronize(worker.device)
        # Naming the device lets the barrier run on this rank's GPU rather than
        # guessing one.
        dist.barrier(device_ids=[worker.device.index])
    else:
        dist.barrier()


def measure(size_bytes: int, dtype: torch.dtype, iters: int, warmup: int, worker: Worker) -> Result:
    """All-reduce a size_bytes tensor warmup + iters times and check one more; identical call on every rank."""
    count = size_bytes // dtype.itemsize
    # Zeros stay zeros under SUM, so the repeated in-place reductions cannot
    # overflow to inf; the values do not change the speed.
    buffer = torch.zeros(count, dtype=dtype, device=worker.device)
    # Warm-up runs pay the one-time costs (NCCL connection setup, memory
    # registration, allocator growth) that would otherwise inflate the timing.
    for _ in range(warmup):
        dist.all_reduce(buffer)
    # Start together: a rank arriving late would make the first timed call look
    # slow on all the others.
    synchronize(worker)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buffer)
    if worker.device.type == "cuda":
        torch.cuda.synchronize(worker.device)
    elapsed = time.perf_counter() - start

    # Correctness: rank r contributes r+1, so the sum is n(n+1)/2 everywhere.
    buffer.fill_(worker.rank + 1)
    dist.all_reduce(buffer)
    expected = worker.world_size * (worker.world_size + 1) / 2
    # Summing n numbers may round by up to about n x epsilon in 16-bit types.
    tolerance = expected * torch.finfo(dtype).eps * worker.world_size
    error = (buffer.double() - expected).abs()
    wrong_here = bool((error > tolerance).any())
    if wrong_here:
        index = int(error.argmax())
        emit(
            f"rank {worker.rank}: wrong all-reduce result for {size_bytes} bytes: element {index} is "
            f"{buffer[index].item()}, expected {expected}",
            file=sys.stderr,
        )

    # The collective is finished only when the slowest rank is done, so report
    # the maximum time over ranks, and whether any rank saw a wrong result.
    stats = torch.tensor([elapsed, float(wrong_here)], dtype=torch.float64, device=worker.device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    seconds = stats[0].item() / iters
    algbw = size_bytes / seconds / 1e9
    return Result(
        size_bytes=size_bytes,
        count=count,
        time_us=seconds * 1e6,
        algbw_gbps=algbw,
        busbw_gbps=bus_bandwidth(algbw, worker.world_size),
        correct=stats[1].item() == 0,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; return 0, or 1 when any size gave a wrong result (on every rank alike)."""
    args = parse_args(argv)
    dtype = DTYPES[args.dtype]
    backend, device = choose_backend(args.backend, int(os.environ.get("LOCAL_RANK", "0")))
    max_bytes = args.max_bytes if args.max_bytes is not None else DEFAULT_MAX_BYTES[device.type]
    if args.min_bytes > max_bytes:
        raise SystemExit(f"error: --min-bytes {args.min_bytes} is larger than --max-bytes {max_bytes}")
    sizes = sweep_sizes(args.min_bytes, max_bytes, args.factor, dtype.itemsize)

    worker = init_distributed(backend, device)
    try:
        # One line per rank, so a launcher's logs show every worker and where it runs.
        emit(
            f"rank {worker.rank}/{worker.world_size} local_rank {worker.local_rank} on {socket.gethostname()} "
            f"backend {worker.backend} device {worker.device}"
        )
        leader = worker.rank == 0
        if leader:
            ranks = f"{worker.world_size} rank{'s' if worker.world_size > 1 else ''}"
            emit(
                f"# all_reduce (sum, in place): {ranks}, backend {worker.backend}, "
                f"dtype {args.dtype}, {args.iters} timed iterations after {args.warmup} warm-up\n#\n"
                f"# {'size(B)':>12} {'count':>12} {'type':>9} {'time(us)':>11} {'algbw(GB/s)':>12} "
                f"{'busbw(GB/s)':>12} {'check':>6}"
            )
        results: list[Result] = []
        for size in sizes:
            result = measure(size, dtype, args.iters, args.warmup, worker)
            results.append(result)
            if leader:
                emit(
                    f"  {result.size_bytes:>12} {result.count:>12} {args.dtype:>9} {result.time_us:>11.1f} "
                    f"{result.algbw_gbps:>12.3f} {result.busbw_gbps:>12.3f} "
                    f"{'OK' if result.correct else 'WRONG':>6}"
                )

        # The mean over all sizes, as nccl-tests reports it; the largest sizes
        # are the ones that show what the links can do.
        avg_busbw = sum(r.busbw_gbps for r in results) / len(results)
        wrong = [r.size_bytes for r in results if not r.correct]
        if leader:
            emit(f"# Avg bus bandwidth: {avg_busbw:.3f} GB/s")
            if wrong:
                emit(
                    f"error: all-reduce returned wrong results for {len(wrong)} of {len(results)} sizes "
                    f"(bytes: {', '.join(map(str, wrong))}); see the ranks' messages above",
                    file=sys.stderr,
                )
            if args.json is not None:
                report = {
                    "world_size": worker.world_size,
                    "backend": worker.backend,
                    "device": worker.device.type,
                    "dtype": args.dtype,
                    "iters": args.iters,
                    "warmup": args.warmup,
                    "results": [asdict(r) for r in results],
                    "avg_busbw_gbps": avg_busbw,
                    "correct": not wrong,
                }
                with open(args.json, "w", encoding="utf-8") as file:
                    json.dump(report, file, indent=2)
                    file.write("\n")
        # Every rank knows the verdict (it was all-reduced), so all exit alike.
        return 1 if wrong else 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
