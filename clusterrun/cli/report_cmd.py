"""`clusterrun report`: write the HTML page of a run (or of a doctor round) again, and say where it is."""

from __future__ import annotations

from pathlib import Path

import click

from clusterrun.cli.run_args import RUN_ARG, RUNS_DIR


def _doctor_round(runs_dir: Path, ref: str) -> Path | None:
    """The doctor round ``ref`` names (a directory, or ``doctor-<time>`` in the runs directory), else None."""
    for candidate in (Path(ref), runs_dir / ref):
        if candidate.is_dir() and ((candidate / "report.json").exists() or (candidate / "evidence").is_dir()
                                   or candidate.name.startswith("doctor-")):
            return candidate
    return None


@click.command(epilog="""\b
Examples:
  clusterrun report                        # the last run's page
  clusterrun report 20261123-101500-a1b2 --open
  clusterrun report doctor-20261123-101500  # a doctor round's page
  clusterrun report last -o /tmp/run.html""")
@RUN_ARG
@RUNS_DIR
@click.option("--open", "open_page", is_flag=True, help="Open the page in the web browser too.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the page here (default: report.html in the run's directory).")
def report(run: str, runs_dir: Path, open_page: bool, out: Path | None) -> int:
    """Write the HTML page of RUN (an id, a unique part of one, last, or a doctor round's directory) and print
    where it is.

    One self-contained file that works offline: the run's timeline per node and rank, its first
    failure with the last lines, every attempt, output per rank and the plan (secrets masked); for
    a doctor round, each network's matrix of measured pairs, every check per node with its fix, and
    each node against the fleet. `up` and `doctor` write it themselves; this writes it again.
    """
    from clusterrun.report import write_doctor_page, write_run_page

    round_dir = _doctor_round(runs_dir, run) if run != "last" else None
    if round_dir is not None:
        page = write_doctor_page(round_dir, out)
    else:
        from clusterrun.cli.detached_cmd import refreshed
        from clusterrun.runs import find_run

        found = find_run(runs_dir, run)
        refreshed(found)  # a detached run still going: its page as its supervisor has it
        page = write_run_page(found.path, out)
    click.echo(str(page))
    if open_page:
        import webbrowser

        if not webbrowser.open(page.resolve().as_uri()):
            click.echo("clusterrun: no web browser found to open it", err=True)
    return 0
