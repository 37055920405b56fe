"""Comment lines for exported documents (``#`` starts a comment in both shell and YAML).

Text from the user (a script path, a variable's name) can hold anything; a line break in it would end the comment
and turn the rest into code, so every comment is made of single-line, control-free text first.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable

WIDTH = 100
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_CODE_RE = re.compile(r"`[^`]*`")
# Stands for a space that must not break a line (inside `code`); text from one_line() never holds it.
_KEEP = "\x00"


def one_line(text: str) -> str:
    """``text`` with every run of control characters (line breaks included) turned into one space."""
    return _CONTROL_RE.sub(" ", text)


def _wrap(text: str, first: str, later: str) -> list[str]:
    """``text`` wrapped to :data:`WIDTH`, a `code span` kept on one line."""
    kept = _CODE_RE.sub(lambda m: m.group(0).replace(" ", _KEEP), one_line(text))
    lines = textwrap.wrap(kept, WIDTH, initial_indent=first, subsequent_indent=later, break_long_words=False,
                          break_on_hyphens=False)
    return [line.replace(_KEEP, " ") for line in lines]


def paragraph(text: str) -> list[str]:
    """``text`` as wrapped comment lines."""
    return _wrap(text, "# ", "# ") or ["#"]


def bullets(title: str, items: Iterable[str]) -> list[str]:
    """``# title`` then ``# - item`` for each item (wrapped, continued under the text); nothing without items."""
    lines: list[str] = []
    for item in items:
        lines += _wrap(item, "# - ", "#   ")
    return [f"# {one_line(title)}", *lines] if lines else []
