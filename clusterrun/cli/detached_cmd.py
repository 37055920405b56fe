"""Commands on a detached run, whose supervisor runs on rank 0's node: `attach`, and the look every other command
(`status`, `logs`, `down`, `runs`, `report`) takes at it first."""

from __future__ import annotations

import getpass
import socket
import sys
import time
from pathlib import Path
from typing import Any

import click

#: Looks in a row that may fail (the node unreachable) before `attach` or `logs -f` stop following.
MAX_MISSES = 30


def refreshed(found: Any, *, quiet: bool = False) -> Any:
    """Bring the mirror of a detached run up to date (nothing for any other run, or one whose end is recorded):
    what the look found, or None. A node that cannot be asked is said on stderr; the last mirror is shown."""
    from clusterrun.ops.mirror import over, refresh, send_pending, settle, supervisor_of

    host = supervisor_of(found)
    if host is None or over(found):
        return None
    got = refresh(found)
    if got.problem and not quiet:
        click.echo(f"clusterrun: {got.problem}; showing the run as last seen", err=True)
    elif got.alive is False and not over(found):
        said = settle(found, host)
        if not quiet:
            click.echo(f"clusterrun: {said}", err=True)
    for line in send_pending(found):
        click.echo(f"clusterrun: {line}", err=True)
    if over(found):  # its end reached this machine just now: the page says so too
        from clusterrun.cli.pages import leave_page

        leave_page(found.path)
    return got


def stop_detached(found: Any, grace: float) -> int | None:
    """`down` of a run detached to a supervisor: ask it to stop and wait until the run is stopped and recorded.
    None when the run has no supervisor (the caller sweeps the nodes itself)."""
    from clusterrun.launch.settings import SupervisorSettings
    from clusterrun.ops.mirror import LOOK_EVERY, over, refresh, settle, supervisor_of
    from clusterrun.runs import read_record

    host = supervisor_of(found)
    if host is None:
        return None
    refreshed(found, quiet=True)
    record = read_record(found)
    if over(found):
        click.echo(f"run {found.run_id} already ended ({record.state.value}"
                   + (f", exit code {record.exit_code}" if record.exit_code is not None else "")
                   + "): nothing to stop; its record is unchanged")
        return 0
    by = f"clusterrun down ({getpass.getuser()}@{socket.gethostname()})"
    got = refresh(found, stop=by)
    if got.problem:
        click.echo(f"clusterrun: {got.problem}", err=True)
        return None  # the nodes are swept from here instead
    # The supervisor stops every node (SIGTERM, SIGKILL after its grace period) and records the end.
    settings = SupervisorSettings()
    deadline = time.monotonic() + grace + settings.stop_timeout + 60
    while got.alive and not over(found) and time.monotonic() < deadline:
        time.sleep(LOOK_EVERY)
        got = refresh(found)
    if not over(found):
        click.echo(f"clusterrun: {settle(found, host)}", err=True)
    record = read_record(found)
    for name, node in record.nodes.items():
        click.echo(f"{name}: {node.state.value if node.state else 'unknown'}"
                   + (f" ({node.reason})" if node.reason else ""))
    click.echo(f"run {found.run_id}: {record.state.value}" + (f", stopped by {record.stopped_by}"
                                                              if record.stopped_by else "")
               + (f"; first failure: {record.first_failure.describe()}" if record.first_failure else ""))
    return 0 if over(found) else 1


@click.command(epilog="""\b
Examples:
  clusterrun attach              # the last run
  clusterrun attach 20261123-101500-a1b2

Ctrl-C leaves the run running: `clusterrun attach RUN` shows it again, `clusterrun down RUN` stops it.""")
@click.argument("run", default="last", required=False, metavar="[RUN]")
@click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"),
              show_default=True, help="Where the run directories are.")
@click.option("--lines", type=click.IntRange(0, 100000), default=20, show_default=True,
              help="How many lines of what the run printed so far to show first.")
def attach(run: str, runs_dir: Path, lines: int) -> int:
    """Show a detached run's output live, as `clusterrun up` shows it, until it ends (then its summary).

    The run's supervisor on rank 0's node keeps its output; this only looks. Ctrl-C stops looking, not the run.
    """
    from clusterrun.detached.host import CONSOLE_LOG
    from clusterrun.errors import UsageError
    from clusterrun.ops.mirror import LOOK_EVERY, over, supervisor_of
    from clusterrun.runs import find_run

    found = find_run(runs_dir, run)
    if supervisor_of(found) is None:
        raise UsageError(f"run {found.run_id} was not detached: its output went to the terminal that started it; "
                         f"`clusterrun logs {found.run_id}` prints its rank logs")
    refreshed(found)
    path = found.path / CONSOLE_LOG
    data = path.read_bytes() if path.is_file() else b""
    done = data.rfind(b"\n") + 1  # what is shown: whole lines only, from this machine's copy of the console
    shown = data[:done].decode("utf-8", errors="replace").splitlines(keepends=True)
    sys.stdout.write("".join(shown[-lines:]) if lines else "")  # where the run stands
    sys.stdout.flush()
    misses = 0
    try:
        while not over(found):
            time.sleep(LOOK_EVERY)
            got = refreshed(found, quiet=True)
            if got is None:
                break
            misses = misses + 1 if got.problem else 0
            if misses >= MAX_MISSES:
                click.echo(f"clusterrun: {got.problem}; stopped looking (the run goes on): `clusterrun attach "
                           f"{found.run_id}` again later", err=True)
                return 1
            done = _show_from(path, done)
    except KeyboardInterrupt:
        click.echo(f"\nclusterrun: detached from run {found.run_id}; it goes on on its nodes (`clusterrun attach "
                   f"{found.run_id}` shows it again, `clusterrun down {found.run_id}` stops it)", err=True)
        return 0
    from clusterrun.cli.status_text import print_status

    _show_from(path, done)
    click.echo()
    print_status(found)
    return 0


def _show_from(path: Path, done: int) -> int:
    """Print the console's whole lines past ``done`` (this machine's copy, which another `attach` or `logs` may
    have brought here); returns where the printed lines end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(done)
            data = fh.read()
    except OSError:
        return done
    end = data.rfind(b"\n") + 1
    sys.stdout.write(data[:end].decode("utf-8", errors="replace"))
    sys.stdout.flush()
    return done + end
