"""Entry point: a click group whose commands are imported only when used.

``clusterrun --help`` must answer fast on a login node, so nothing here (or in
the command modules' top level) imports pydantic, rich, paramiko or torch.
"""

from __future__ import annotations

import importlib
import sys

import click

from clusterrun import __version__

#: command name -> (module, attribute, one-line help shown by `clusterrun --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "up": ("clusterrun.cli.up_cmd", "up", "Start a training script on every node with torchrun and supervise it."),
    "doctor": ("clusterrun.cli.doctor_cmd", "doctor", "Check every node and the network between them; say what to fix."),
    "plan": ("clusterrun.cli.plan_cmd", "plan", "Show exactly what `up` would run on each node, without running it."),
    "init": ("clusterrun.cli.init_cmd", "init", "Write an inventory by probing the nodes given with --ips/--hostfile/--slurm."),
    "exec": ("clusterrun.cli.exec_cmd", "exec_", "Run a shell command on every node at once, with a per-node summary."),
    "runs": ("clusterrun.cli.runs_cmd", "runs", "List past and running runs with their state and exit code."),
    "status": ("clusterrun.cli.runs_cmd", "status", "Show one run: per node and rank what happened."),
    "logs": ("clusterrun.cli.runs_cmd", "logs", "Print (or follow) a run's rank logs, prefixed [node:rank]."),
    "down": ("clusterrun.cli.runs_cmd", "down", "Stop a run, or whatever is left of one, on every node."),
    "attach": ("clusterrun.cli.detached_cmd", "attach", "Show a detached run's output live; Ctrl-C leaves it running."),
    "metrics": ("clusterrun.cli.metrics_cmd", "metrics", "Show a run's series per node: NICs, GPUs, ranks; energy; wrong NIC."),
    "report": ("clusterrun.cli.report_cmd", "report", "Write a run's (or doctor round's) HTML page and print where."),
    "ps": ("clusterrun.cli.ps_cmd", "ps", "Show what runs on the nodes, whoever started it: run, user, GPUs, since."),
    "check": ("clusterrun.cli.check_cmd", "check", "Validate an inventory file and report every problem with its line."),
    "schema": ("clusterrun.cli.schema_cmd", "schema", "Print the inventory's JSON Schema (for editor completion)."),
    "export": ("clusterrun.cli.export_cmd", "export", "Write the job as an sbatch script or a Kubeflow PyTorchJob/TrainJob."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module = importlib.import_module(entry[0])
        return getattr(module, entry[1])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The short helps live in COMMANDS so that listing them imports nothing.
        with formatter.section("Commands"):
            formatter.write_dl([(name, entry[2]) for name, entry in COMMANDS.items()])


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  clusterrun up inventories/localhost.yaml examples/train_ddp.py
  clusterrun plan cluster.yaml train.py --lr 0.1
  clusterrun up cluster.yaml train.py --epochs 10
  clusterrun check cluster.yaml

Run `clusterrun COMMAND --help` for each command's options and examples.""",
)
@click.version_option(__version__, "-V", "--version", prog_name="clusterrun")
def cli() -> None:
    """Launch multi-node PyTorch training from one YAML inventory.

    clusterrun derives master_addr, node_rank, nproc_per_node and the NCCL network
    environment for every node, starts torchrun on all of them at once, streams
    every rank's output, and stops everything when a rank fails or you press Ctrl-C.
    """


def _warnings_to_stderr() -> None:
    """The library's warnings (a skipped known_hosts line, an ssh_config block not applied) as clusterrun's lines."""
    import logging

    class ToStderr(logging.StreamHandler):  # type: ignore[type-arg]
        def emit(self, record: logging.LogRecord) -> None:
            self.stream = sys.stderr  # whatever stderr is now (tests and callers swap it)
            super().emit(record)

    logger = logging.getLogger("clusterrun")
    if not any(isinstance(h, logging.StreamHandler) and getattr(h, "clusterrun", False) for h in logger.handlers):
        handler = ToStderr()
        handler.setFormatter(logging.Formatter("clusterrun: warning: %(message)s"))
        handler.setLevel(logging.WARNING)
        handler.clusterrun = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    # paramiko logs "Socket exception: Bad file descriptor" when a connection closes under its reading thread
    # (clusterrun closing its connections at the end); with no handler Python prints it bare on stderr, where it
    # reads like a failure. What really fails reaches the user as clusterrun's own errors.
    paramiko = logging.getLogger("paramiko")
    if not paramiko.handlers:
        paramiko.addHandler(logging.NullHandler())


def _explain_foreign(exc: click.NoSuchOption) -> None:
    """Another launcher's flag (``doctor --nnodes 2``): click's message becomes clusterrun's equivalent."""
    from clusterrun.cli.foreign_flags import explain

    command = exc.ctx.command if exc.ctx is not None else None
    options = {name for param in (command.params if command else []) for name in param.opts}
    text = explain(exc.option_name, options)
    if text:
        exc.message, exc.possibilities = text, None


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; clusterrun's own errors become a message on stderr and their exit code."""
    from clusterrun.errors import ClusterrunError
    from clusterrun.waits import ctrl_c_whole

    _warnings_to_stderr()
    try:
        with ctrl_c_whole():  # a Ctrl-C that tore a lock's wait comes out as Ctrl-C (clusterrun.waits)
            result = cli.main(args=argv, prog_name="clusterrun", standalone_mode=False)
    except ClusterrunError as exc:
        from clusterrun.launch.console import safe

        click.echo(f"clusterrun: error: {safe(str(exc))}", err=True)  # what the user typed may hold escapes
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("clusterrun: aborted", err=True)
        from clusterrun.waits import exit_without_waiting

        exit_without_waiting(130)
        return 130
    except click.NoSuchOption as exc:
        _explain_foreign(exc)
        exc.show()
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except BrokenPipeError:
        # `clusterrun plan ... | head`: the reader left; not an error worth a traceback.
        sys.stderr.close()
        return 141
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
