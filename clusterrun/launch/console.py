"""Where a run's lines go on the orchestrator's terminal.

Every line is written whole, by one thread, prefixed ``[node:rank]`` (``[node]`` for
torchrun's own messages); on a terminal each node gets its own colour.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from typing import TextIO

_PALETTE = ("cyan", "green", "yellow", "magenta", "blue", "bright_cyan", "bright_green", "bright_yellow",
            "bright_magenta", "bright_blue", "red", "white")


class Console:
    """Prints rank lines and clusterrun's own messages.

    ``ranks``: only these global ranks' lines are shown (all when None);
    ``quiet``: no rank lines at all (the logs are still written).
    """

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, *, color: bool | None = None,
                 ranks: Collection[int] | None = None, quiet: bool = False, show_launcher: bool = True) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.color = self.out.isatty() if color is None else color
        self.ranks = set(ranks) if ranks is not None else None
        self.quiet = quiet
        self.show_launcher = show_launcher
        self._colors: dict[str, str] = {}

    def _prefix(self, tag: str, node: str) -> str:
        if not self.color:
            return tag
        import click

        color = self._colors.setdefault(node, _PALETTE[len(self._colors) % len(_PALETTE)])
        return click.style(tag, fg=color)

    def rank_line(self, node: str, rank: int, text: str) -> None:
        if self.quiet or (self.ranks is not None and rank not in self.ranks):
            return
        self.out.write(f"{self._prefix(f'[{node}:{rank}]', node)} {text}\n")
        self.out.flush()

    def node_line(self, node: str, text: str) -> None:
        if self.quiet or not self.show_launcher:
            return
        self.out.write(f"{self._prefix(f'[{node}]', node)} {text}\n")
        self.out.flush()

    def info(self, text: str) -> None:
        self.err.write(f"clusterrun: {text}\n")
        self.err.flush()
