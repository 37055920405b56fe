"""A small, complete DistributedDataParallel (DDP) training run.

Start it on one machine with two processes:

    torchrun --nproc-per-node 2 examples/train_ddp.py

or on every node of a cluster with clusterrun:

    clusterrun up inventory.yaml examples/train_ddp.py -- --epochs 5

torchrun starts one process per GPU (or per CPU slot) and tells each one who it
is through environment variables: RANK (global index, 0..WORLD_SIZE-1),
LOCAL_RANK (index inside its node, used to pick the GPU), WORLD_SIZE (processes
in the whole job), and MASTER_ADDR/MASTER_PORT (where rank 0 listens so that the
others can find each other). Without RANK the script runs as a single process.

The task is a synthetic 4-class classification problem whose labels come from a
fixed random linear "teacher", so the loss must go down and the final accuracy
must be high: a quick end-to-end check that a cluster can train, not only start.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES = 32
CLASSES = 4


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="passes over the training set (default: 3)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="samples per step on each rank; the global batch is this times the world size (default: 64)",
    )
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default: 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="seed for data, model and shuffling (default: 0)")
    parser.add_argument("--hidden", type=int, default=64, help="width of the MLP's hidden layers (default: 64)")
    parser.add_argument("--samples", type=int, default=4096, help="training samples (default: 4096)")
    parser.add_argument(
        "--backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help="collective backend; auto picks nccl when CUDA is available, else gloo (default: auto)",
    )
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "hidden", "samples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def choose_backend(requested: str, local_rank: int) -> tuple[str, torch.device]:
    """Return the backend and device for this process, or exit explaining why there is no GPU for it.

    Every rank of a job must pick the same backend: a cluster that mixes GPU and
    CPU-only nodes must pass --backend explicitly.
    """
    if requested == "gloo" or (requested == "auto" and not torch.cuda.is_available()):
        return "gloo", torch.device("cpu")
    # NCCL only moves CUDA tensors, one GPU per process. LOCAL_RANK indexes the
    # GPUs this process can see (after CUDA_VISIBLE_DEVICES), so a node must not
    # start more processes than it has visible GPUs: two ranks on one GPU is an
    # error in NCCL, and falling back to gloo on some ranks only would hang.
    visible = torch.cuda.device_count()
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    if visible == 0:
        raise SystemExit(
            f"error: backend nccl needs a GPU but CUDA sees none (CUDA_VISIBLE_DEVICES={cuda_visible}); "
            "pass --backend gloo to train on CPU"
        )
    if local_rank >= visible:
        raise SystemExit(
            f"error: local_rank {local_rank} has no GPU: this node sees {visible} "
            f"(CUDA_VISIBLE_DEVICES={cuda_visible}); start at most {visible} processes per node "
            f"(--nproc-per-node {visible}) or pass --backend gloo"
        )
    return "nccl", torch.device("cuda", local_rank)


def init_distributed(requested_backend: str) -> Worker:
    """Join the process group that torchrun set up (or a one-process group without torchrun)."""
    launched_by_torchrun = "RANK" in os.environ
    if launched_by_torchrun:
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
    else:
        emit(
            "note: RANK is not set, so this was not started by torchrun; running as a single process "
            "(world size 1). For data parallel training: torchrun --nproc-per-node 2 " + sys.argv[0],
            file=sys.stderr,
        )
        rank, local_rank, world_size = 0, 0, 1

    backend, device = choose_backend(requested_backend, local_rank)
    if device.type == "cuda":
        # Bind this process to its GPU *before* creating the process group, so
        # NCCL builds its communicator on the right device (otherwise every rank
        # of a node would start on cuda:0).
        torch.cuda.set_device(device)

    if launched_by_torchrun:
        # The default init_method "env://" reads MASTER_ADDR, MASTER_PORT, RANK
        # and WORLD_SIZE. Every rank connects to rank 0's TCP store at
        # MASTER_ADDR:MASTER_PORT; this blocks until all WORLD_SIZE ranks arrived.
        dist.init_process_group(backend=backend)
    else:
        # A one-process group needs no rendezvous: an in-memory store will do.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return Worker(rank, local_rank, world_size, backend, device)


def make_data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return Gaussian inputs labelled by a fixed random linear teacher (4 linearly separable classes).

    Every rank builds the *same* data from the same seed; DistributedSampler
    then gives each rank a disjoint share of it. Real jobs get the same effect by
    reading the same files on every node.
    """
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    labels = (inputs @ teacher).argmax(dim=1)
    return inputs, labels


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )


def train(args: argparse.Namespace, worker: Worker) -> None:
    on_cuda = worker.device.type == "cuda"
    # Seeding makes runs repeatable. It is not what keeps the replicas equal:
    # DDP broadcasts rank 0's parameters to every rank when it wraps the model.
    torch.manual_seed(args.seed)

    # The last fifth is held out to measure accuracy on samples never trained on.
    inputs, labels = make_data(args.samples + args.samples // 4, args.seed)
    train_set = TensorDataset(inputs[: args.samples], labels[: args.samples])
    test_inputs, test_labels = inputs[args.samples :], labels[args.samples :]

    # Every rank must run the same number of steps: each backward() ends in a
    # gradient all-reduce, and a rank with one extra batch waits forever for
    # peers that have already finished (the classic "hangs at the end of the
    # epoch" of multi-node jobs). DistributedSampler gives each rank an equal
    # share; drop_last=True drops the remainder instead of padding it with
    # repeated samples, so no sample is counted twice.
    sampler = DistributedSampler(
        train_set,
        num_replicas=worker.world_size,
        rank=worker.rank,
        shuffle=True,
        seed=args.seed,
        drop_last=True,
    )
    loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        sampler=sampler,
        # Full batches only, so every step has the same shape on every rank.
        drop_last=True,
        # Page-locked host memory lets the copy to the GPU run asynchronously
        # (non_blocking=True below). It only helps with CUDA and costs host RAM.
        pin_memory=on_cuda,
    )
    if len(loader) == 0:
        raise SystemExit(
            f"error: {args.samples} samples over {worker.world_size} ranks leave less than one batch of "
            f"{args.batch_size} per rank; lower --batch-size or raise --samples"
        )

    model = make_model(args.hidden).to(worker.device)
    # DDP keeps one replica per rank and all-reduces (averages) the gradients
    # during backward(), so after each step every replica holds the same weights.
    # device_ids tells it which GPU this replica lives on; on CPU it must be None.
    ddp_model = DistributedDataParallel(model, device_ids=[worker.device.index] if on_cuda else None)
    # Gradients are averaged over ranks, so the effective batch is batch_size x
    # world_size: when adding nodes, the learning rate often needs to grow too.
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(1, args.epochs + 1):
        # Without set_epoch every epoch would shuffle in the same order: the
        # sampler seeds its permutation with seed + epoch, identically on every
        # rank, which is what keeps the ranks' shares disjoint.
        sampler.set_epoch(epoch)
        ddp_model.train()
        # Accumulate on the device: calling loss.item() every step would force a
        # GPU synchronisation per step and stall the pipeline.
        loss_sum = torch.zeros((), dtype=torch.float64, device=worker.device)
        seen = 0
        start = time.perf_counter()
        for inputs, labels in loader:
            inputs = inputs.to(worker.device, non_blocking=True)
            labels = labels.to(worker.device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp_model(inputs), labels)
            loss.backward()  # the gradient all-reduce overlaps with this
            optimizer.step()
            loss_sum += loss.detach() * labels.numel()
            seen += labels.numel()

        # Each rank only saw its own share. Sum losses and sample counts over all
        # ranks (one collective for both) so rank 0 can print the global mean.
        totals = torch.stack([loss_sum, torch.tensor(float(seen), dtype=torch.float64, device=worker.device)])
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        elapsed = time.perf_counter() - start  # the all_reduce waited for the slowest rank
        mean_loss, global_seen = (totals[0] / totals[1]).item(), totals[1].item()
        if worker.rank == 0:
            emit(f"epoch {epoch} loss {mean_loss:.3f} ({global_seen / elapsed:.0f} samples/s)")

    evaluate(model, test_inputs, test_labels, worker)


@torch.no_grad()
def evaluate(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, worker: Worker) -> None:
    """Print the loss and accuracy on the held-out set, each rank scoring a disjoint slice.

    The plain module is used, not the DDP wrapper: no gradients means nothing to
    synchronise, and the replicas already hold identical weights.
    """
    model.eval()
    # Slicing rank::world_size splits the set exactly, without the padding a
    # DistributedSampler would add to make the shares equal.
    mine = slice(worker.rank, None, worker.world_size)
    x, y = inputs[mine].to(worker.device), labels[mine].to(worker.device)
    logits = model(x)
    totals = torch.stack(
        [
            nn.functional.cross_entropy(logits, y, reduction="sum").double(),
            (logits.argmax(dim=1) == y).sum().double(),
            torch.tensor(float(y.numel()), dtype=torch.float64, device=worker.device),
        ]
    )
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    loss_sum, correct, count = totals.tolist()
    if worker.rank == 0:
        emit(
            f"final test loss {loss_sum / count:.3f} accuracy {100 * correct / count:.1f}% "
            f"({int(count)} held-out samples)"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    worker = init_distributed(args.backend)
    try:
        # One line per rank, flushed at once: a launcher's logs then show that
        # every worker started, and where.
        emit(
            f"rank {worker.rank}/{worker.world_size} local_rank {worker.local_rank} on {socket.gethostname()} "
            f"backend {worker.backend} device {worker.device}"
        )
        train(args, worker)
        # The DDP wrapper (its reducer) holds the process group; collect it now,
        # so the group's gloo threads stop here and not during interpreter exit,
        # where tearing them down can abort the process (SIGABRT after success).
        gc.collect()
        dist.barrier()
    finally:
        # Releases the communicators and sockets cleanly; skipping it makes NCCL
        # warn at exit and can leave peers waiting.
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
