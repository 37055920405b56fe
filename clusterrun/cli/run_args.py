"""The argument and option of every command on a past or running run (`runs`, `status`, `logs`, `down`, `report`,
`metrics`): RUN, and where the run directories are."""

from __future__ import annotations

from pathlib import Path

import click

RUNS_DIR = click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"),
                        show_default=True, help="Where the run directories are.")
RUN_ARG = click.argument("run", default="last", required=False, metavar="[RUN]")
