"""Writing a page: render from the directory, write atomically beside it (or where asked), return the path.

A page is a report of what happened, never a new way to fail: whatever the directory holds, a page is written.
When rendering itself fails (a bug here, not bad input: bad input is said on the page), the page written says
so, with the error, and the run or round is untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from clusterrun.report.html import document, esc, missing
from clusterrun.runs import atomic_write

#: The page's file name in a run or doctor directory.
PAGE = "report.html"

log = logging.getLogger("clusterrun")


def _render(what: str, directory: Path, render: Callable[[Path], str]) -> str:
    try:
        return render(directory)
    except Exception as exc:  # a bug in a page must not fail the run or the round it reports on
        log.warning("the %s page of %s could not be drawn (%s: %s); this is a clusterrun bug", what, directory,
                    type(exc).__name__, exc)
        return document(f"clusterrun {what}: {directory.name}", esc(str(directory)),
                        [missing(f"this page could not be drawn ({type(exc).__name__}: {exc}); the directory's "
                                 "files (status.json, plan.json, report.json, logs) hold everything")])


def _doctor(directory: Path) -> str:
    from clusterrun.report.doctor_data import load_round
    from clusterrun.report.doctor_page import doctor_page

    return doctor_page(load_round(directory))


def _run(directory: Path) -> str:
    from clusterrun.report.run_data import load_run
    from clusterrun.report.run_page import run_page

    return run_page(load_run(directory))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)
    return path


def write_doctor_page(directory: Path, out: Path | None = None) -> Path:
    """The page of the doctor round in ``directory``, written to ``out`` (default ``directory/report.html``).
    Returns where. Raises OSError only when the file cannot be written."""
    return _write(out or directory / PAGE, _render("doctor", directory, _doctor))


def write_run_page(directory: Path, out: Path | None = None) -> Path:
    """The page of the run in ``directory``, written to ``out`` (default ``directory/report.html``). Returns
    where. Raises OSError only when the file cannot be written."""
    return _write(out or directory / PAGE, _render("run", directory, _run))
