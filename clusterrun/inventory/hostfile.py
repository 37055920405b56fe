"""DeepSpeed / OpenMPI hostfiles: one host per line with its slot (GPU) count.

::

    # comments run from '#' to the end of the line
    worker-1 slots=4
    worker-2 slots=4   max_slots=4
    10.0.0.3                         # no slots: the caller decides (all GPUs)

Like DeepSpeed's launcher, a host listed twice or a line that cannot be read is an
error rather than skipped, and a file with no hosts is an error. Unlike DeepSpeed,
``slots=`` may be left out (OpenMPI allows it); ``slots`` and OpenMPI's ``max_slots``
(also spelled ``max-slots``) must be whole numbers from 1 to :data:`MAX_SLOTS`, and any other
``key=value`` is an error so that a typo is not silently ignored. PRRTE/OpenMPI's ``^host`` (exclude
a host) is refused with its line, as is any host that starts with a character no host name starts with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterrun.errors import InventoryError
from clusterrun.inventory.hostspec import normalize_host
from clusterrun.inventory.types import brief_repr

_COUNT_RE = re.compile(r"[0-9]+")
_SPACED_EQUALS_RE = re.compile(r"\s=|=\s")
_KEYS = {"slots": "slots", "max_slots": "max_slots", "max-slots": "max_slots"}
#: Most slots a host may have: the most processes clusterrun runs on one node (``nproc_per_node``).
MAX_SLOTS = 1024


@dataclass(frozen=True)
class HostfileEntry:
    """One host line. ``slots``/``max_slots`` are None when the line does not give them;
    ``lineno`` is 1-based, for error messages that point back into the file."""

    host: str
    slots: int | None
    lineno: int
    max_slots: int | None = None


def parse_hostfile(text: str, path: str = "<hostfile>") -> list[HostfileEntry]:
    """Parse hostfile ``text``; ``path`` is only used in messages.

    Returns one entry per host line, in file order.
    Raises :class:`InventoryError` listing every problem as ``path:line: message``:
    a line without a host (``slots=4`` alone), an invalid host name, a setting that is not
    ``slots=N``/``max_slots=N`` with N from 1 to :data:`MAX_SLOTS`, ``max_slots`` below ``slots``, a host listed
    twice (naming both lines; host names compared case-insensitively), or no hosts at all.
    """
    entries: list[HostfileEntry] = []
    problems: list[str] = []
    first_seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        try:
            host = _parse_host(fields)
        except ValueError as exc:
            problems.append(f"{path}:{lineno}: {exc}")
            continue
        # Check for a repeat before the settings, so a host listed twice is reported even
        # when one of its lines has another problem too.
        key = host.lower()
        if key in first_seen:
            problems.append(
                f"{path}:{lineno}: host {brief_repr(host)} is listed again (first at {path}:{first_seen[key]}); "
                "list each host once, with all its slots"
            )
            continue
        first_seen[key] = lineno
        try:
            slots, max_slots = _parse_settings(fields)
        except ValueError as exc:
            problems.append(f"{path}:{lineno}: {exc}")
            continue
        entries.append(HostfileEntry(host, slots, lineno, max_slots))
    if problems:
        head = problems[0] if len(problems) == 1 else f"{path}: {len(problems)} problems\n  " + "\n  ".join(problems)
        raise InventoryError(head, tuple(problems))
    if not entries:
        raise InventoryError(f"{path}: no hosts found; write one host per line, like 'worker-1 slots=4'")
    return entries


def _parse_host(fields: list[str]) -> str:
    """Return the line's host (first field), normalised; raises ValueError with one sentence."""
    if "=" in fields[0]:
        raise ValueError(f"{brief_repr(' '.join(fields))} has no host name; start the line with the host, "
                         f"like {brief_repr('worker-1 ' + fields[0])}")
    if fields[0].startswith("^") and len(fields[0]) > 1:
        # PRRTE/OpenMPI read ^host as "exclude host", from the file's hosts or from a resource manager's
        # allocation. clusterrun has no allocation to exclude from and runs every host the file lists, so the
        # line is refused rather than guessed at: deleting a line says the same thing without doubt.
        raise ValueError(f"{brief_repr(fields[0])}: '^' excludes a host in PRRTE/OpenMPI hostfiles; clusterrun runs "
                         f"on every host the file lists: delete the line of {brief_repr(fields[0][1:])} (or comment "
                         "it out with '#'), or pick nodes with --nodes")
    return normalize_host(fields[0])


def _parse_settings(fields: list[str]) -> tuple[int | None, int | None]:
    """Return ``(slots, max_slots)`` from the fields after the host; raises ValueError with one sentence."""
    settings = fields[1:]
    if _SPACED_EQUALS_RE.search(" ".join(settings)):
        raise ValueError(f"{brief_repr(' '.join(settings))}: write settings without spaces around '=', like slots=4")
    values: dict[str, int] = {}
    for token in settings:
        raw_key, sep, value = token.partition("=")
        if not sep:
            raise ValueError(f"unexpected {brief_repr(token)} after host {brief_repr(fields[0])}; put one host per line and "
                             "settings as key=value, like 'worker-1 slots=4'")
        key = _KEYS.get(raw_key)
        if key is None:
            raise ValueError(f"unknown setting {brief_repr(token)}; a host line takes slots=N and optionally max_slots=N")
        if key in values:
            raise ValueError(f"{raw_key} is given twice in {brief_repr(' '.join(fields))}")
        digits = value.lstrip("0")
        if not _COUNT_RE.fullmatch(value) or not digits:
            raise ValueError(f"{brief_repr(token)}: {raw_key} must be a whole number of at least 1, like {raw_key}=4")
        if len(digits) > len(str(MAX_SLOTS)) or int(digits) > MAX_SLOTS:  # the length first: int() refuses 5000 digits
            raise ValueError(f"{brief_repr(token)}: {raw_key} is more than {MAX_SLOTS}, more processes than a node "
                             f"runs; write the node's GPU count, like {raw_key}=8")
        values[key] = int(digits)
    slots, max_slots = values.get("slots"), values.get("max_slots")
    if slots is not None and max_slots is not None and max_slots < slots:
        raise ValueError(f"max_slots={max_slots} is less than slots={slots} for host {brief_repr(fields[0])}")
    return slots, max_slots
