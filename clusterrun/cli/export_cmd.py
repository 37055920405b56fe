"""`clusterrun export`: the job `up` would run, written for Slurm (sbatch) or Kubernetes (Kubeflow)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from clusterrun.cli.job_argv import JobCommand
from clusterrun.cli.job_options import JOB_CONTEXT, job_options, with_job

F = TypeVar("F", bound=Callable[..., Any])


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  clusterrun export sbatch --time 4:00:00 -o train.sbatch cluster.yaml train.py --epochs 10
  clusterrun export sbatch --slurm 'gpu[01-04]' --gpus 0-7 train.py > train.sbatch
  clusterrun export pytorchjob --image ghcr.io/acme/train:1.4 -o job.yaml cluster.yaml train.py
  clusterrun export trainjob --image ghcr.io/acme/train:1.4 --ips a,b --gpus 0-7 train.py

Each takes the nodes and options of `clusterrun plan` and contacts no node. docs/growing.md
says which to use and what carries over.""",
)
def export() -> None:
    """Write the job as another engine runs it: a Slurm batch script, a Kubeflow PyTorchJob or TrainJob.

    The document carries what clusterrun derives (node count, processes and GPUs per node, the
    NCCL/Gloo environment, the script and its arguments) and lists in its comments what it cannot
    carry (per-node NIC names on Kubernetes, secrets' values, clusterrun's watch of the running job).
    """


def _without_json(command: click.Command) -> click.Command:
    # The job options include --json (print the plan); an export always writes its document instead.
    command.params = [p for p in command.params if p.name != "as_json"]
    return command


def _output_options(func: F) -> F:
    options = [
        click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
                     help="Write the document to FILE (default: print it)."),
        click.option("--force", is_flag=True, help="Replace FILE if it exists."),
        click.option("--name", metavar="NAME", help="The job's name (default: from the script and the run id)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _kube_options(func: F) -> F:
    options = [
        click.option("--namespace", metavar="NS", help="The namespace to create the job in (default: kubectl's)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _image(plan: Any) -> str | None:
    """The image of the job: --image, else the inventory's container.image (the first node's)."""
    return plan.master.container.image if plan.master.container is not None else None


def _write(text: str, output: Path | None, force: bool, done: str, plan: Any, warnings: tuple[str, ...] = ()) -> int:
    """Print ``text`` or write it to ``output``; the plan's warnings and ``warnings`` go to stderr either way."""
    from clusterrun.errors import UsageError

    for warning in (*plan.warnings, *warnings):
        click.echo(f"clusterrun: warning: {warning}", err=True)
    if output is None:
        click.echo(text, nl=False)
        return 0
    if output.exists() and not force:
        raise UsageError(f"-o {output}: the file exists; nothing was written (add --force to replace it)")
    output.write_text(text, encoding="utf-8")
    click.echo(f"clusterrun: wrote {output}; {done.format(file=output)}", err=True)
    return 0


@_without_json
@export.command(
    "sbatch",
    cls=JobCommand,
    context_settings=JOB_CONTEXT,
    epilog="""\b
Examples:
  clusterrun export sbatch -o train.sbatch cluster.yaml train.py --epochs 10
  clusterrun export sbatch --time 1-00:00:00 --partition gpu --account ml cluster.yaml train.py
  clusterrun export sbatch --slurm 'gpu[01-04]' --gpus 0-7 -e NCCL_DEBUG=INFO train.py

Slurm chooses the nodes: ranks follow the allocation, the master is its first node. Variables
whose names mark a secret are taken from the environment sbatch runs in, never written.""",
)
@job_options
@_output_options
@click.option("--time", "time_limit", metavar="TIME", help="Time limit (#SBATCH --time), e.g. 2:00:00 or 1-12.")
@click.option("--partition", metavar="NAME", help="Partition (#SBATCH --partition).")
@click.option("--account", metavar="NAME", help="Account to charge (#SBATCH --account).")
@with_job
def sbatch(inv: Any, plan: Any, runs_dir: Any, output: Path | None, force: bool, name: str | None,
           time_limit: str | None, partition: str | None, account: str | None) -> int:
    """Write a Slurm batch script that runs the job with one srun step: torchrun on every allocated node.

    INVENTORY (or --ips/--hostfile/--slurm), SCRIPT and ARGS are read as `clusterrun plan` reads them.
    The environment the plan derives is exported once where it is the same on every node and set per
    node (by Slurm node name) where it differs, such as data NICs named differently on each machine.
    """
    from clusterrun.export.naming import default_name
    from clusterrun.export.sbatch import SbatchOptions, sbatch_script

    options = SbatchOptions(name=name or default_name(plan), time=time_limit, partition=partition, account=account)
    return _write(sbatch_script(plan, inv, options), output, force, "submit it with `sbatch {file}`", plan)


@_without_json
@export.command(
    "pytorchjob",
    cls=JobCommand,
    context_settings=JOB_CONTEXT,
    epilog="""\b
Examples:
  clusterrun export pytorchjob --image ghcr.io/acme/train:1.4 -o job.yaml cluster.yaml train.py
  clusterrun export pytorchjob --image ghcr.io/acme/train:1.4 --namespace ml --ips a,b,c,d --gpus 0-7 train.py

One Master and N-1 Worker replicas; torchrun gets the ranks from the training operator.""",
)
@job_options
@_output_options
@_kube_options
@with_job
def pytorchjob(inv: Any, plan: Any, runs_dir: Any, output: Path | None, force: bool, name: str | None,
               namespace: str | None) -> int:
    """Write a Kubeflow PyTorchJob (kubeflow.org/v1) for the job.

    It carries the node count, processes and GPUs per node, the NCCL/Gloo environment that names no
    node's device, and the script with its arguments; a comment header lists what it cannot carry.
    """
    from clusterrun.export.kubeflow import KubeOptions, cpu_only
    from clusterrun.export.kubeflow import pytorchjob as render

    options = KubeOptions(image=_image(plan), name=name, namespace=namespace)
    namespace_flag = f" -n {namespace}" if namespace else ""
    return _write(render(plan, inv, options), output, force, f"start it with `kubectl apply{namespace_flag} -f {{file}}`",
                  plan, tuple(filter(None, [cpu_only(plan)])))


@_without_json
@export.command(
    "trainjob",
    cls=JobCommand,
    context_settings=JOB_CONTEXT,
    epilog="""\b
Examples:
  clusterrun export trainjob --image ghcr.io/acme/train:1.4 -o job.yaml cluster.yaml train.py
  clusterrun export trainjob --image ghcr.io/acme/train:1.4 --runtime torch-distributed --slurm 'gpu[01-16]' train.py

The TrainJob runs on a ClusterTrainingRuntime of Kubeflow Trainer (default torch-distributed).""",
)
@job_options
@_output_options
@_kube_options
@click.option("--runtime", default="torch-distributed", show_default=True, metavar="NAME",
              help="The ClusterTrainingRuntime the TrainJob runs on.")
@with_job
def trainjob(inv: Any, plan: Any, runs_dir: Any, output: Path | None, force: bool, name: str | None,
             namespace: str | None, runtime: str) -> int:
    """Write a Kubeflow TrainJob (trainer.kubeflow.org/v1alpha1) for the job.

    It carries the node count (numNodes), processes per node (numProcPerNode), GPUs per node, the
    environment you set yourself (no NCCL/Gloo setting derived from the SSH inventory's hosts), and the script with its arguments; a comment
    header lists what it cannot carry.
    """
    from clusterrun.export.kubeflow import KubeOptions, cpu_only
    from clusterrun.export.kubeflow import trainjob as render

    options = KubeOptions(image=_image(plan), name=name, namespace=namespace, runtime=runtime)
    namespace_flag = f" -n {namespace}" if namespace else ""
    return _write(render(plan, inv, options), output, force, f"start it with `kubectl apply{namespace_flag} -f {{file}}`",
                  plan, tuple(filter(None, [cpu_only(plan)])))
