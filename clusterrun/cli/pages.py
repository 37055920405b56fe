"""The HTML pages commands leave in a run's directory without being asked: the run's page (`up`, `down`, and a
detached run's end once it reaches this machine) and the page of `up --preflight full`'s doctor round. `clusterrun
report` writes them again on demand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def leave_page(run_dir: Path) -> None:
    """The run's page in its directory, when there is one (``up``, and a detached run's recorded end); a page
    that cannot be written is a warning, never the run's failure."""
    if not (run_dir / "status.json").is_file():
        return
    from clusterrun.report import write_run_page

    try:
        write_run_page(run_dir)
    except OSError as exc:
        click.echo(f"clusterrun: cannot write {run_dir}/report.html: {exc.strerror or exc}", err=True)


def with_doctor_page(check: Callable[[Any, Any, Path], tuple[list[str], Path]]
                     ) -> Callable[[Any, Any, Path], tuple[list[str], Path]]:
    """``up --preflight full``'s doctor round, which leaves its page in its directory (runs/<id>/doctor/) too."""

    def checked(inv: Any, transports: Any, report_dir: Path) -> tuple[list[str], Path]:
        try:
            return check(inv, transports, report_dir)
        finally:
            if (report_dir / "report.json").is_file():
                from clusterrun.report import write_doctor_page

                try:
                    write_doctor_page(report_dir)
                except OSError as exc:
                    click.echo(f"clusterrun: cannot write {report_dir}/report.html: {exc.strerror or exc}", err=True)

    return checked
