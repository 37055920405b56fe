"""ssh_config, read as OpenSSH reads it: the values that apply to one host, each with the file and line it came from.

``~/.ssh/config`` (or the inventory's ``config_file``, which, like ``ssh -F``, replaces both files) is read
first, then ``/etc/ssh/ssh_config``; for each keyword the first value that applies wins. ``Include`` is
followed (relative names from ``~/.ssh``, or ``/etc/ssh`` in the system file; globs), ``Host`` and ``Match``
blocks apply as in OpenSSH, and a ``Match`` criterion clusterrun cannot evaluate (``exec``,
``localnetwork``, ...) makes its block not apply, with a warning naming the file and line. What the values
mean for a connection is :mod:`clusterrun.transport.ssh_target`'s business.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from clusterrun.errors import UsageError

DEFAULT_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH

log = logging.getLogger(__name__)
_said: set[str] = set()
_said_lock = threading.Lock()


def warn_once(logger: logging.Logger, message: str) -> None:
    """Log ``message`` as a warning the first time it comes up in this process.

    A run resolves every node through the same files, so the same finding would otherwise repeat per node.
    """
    with _said_lock:
        if message in _said:
            return
        _said.add(message)
    logger.warning(message)


@dataclass(frozen=True)
class Origin:
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Proxy:
    """How ssh_config says to reach a host: ``kind`` is ``command`` or ``jump``; ``value`` None means ``none``."""

    kind: str
    value: str | None
    origin: Origin


@dataclass
class HostConfig:
    """The ssh_config values that apply to one host: the first value of each keyword, lower-cased keys."""

    values: dict[str, tuple[str, Origin]] = field(default_factory=dict)
    identity_files: list[tuple[str, Origin]] = field(default_factory=list)
    proxy: Proxy | None = None

    def get(self, key: str) -> str | None:
        found = self.values.get(key)
        return found[0] if found else None

    def words(self, key: str) -> list[str]:
        found = self.values.get(key)
        return _words(found[0], found[1]) if found else []

    def origin(self, key: str) -> Origin | None:
        found = self.values.get(key)
        return found[1] if found else None


_KEYWORD = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+|$)(.*)")
# Keywords whose value is the rest of the line, given to a shell as it is.
_WHOLE_LINE = {"proxycommand", "localcommand", "remotecommand", "knownhostscommand"}
# Keywords clusterrun reads (the others are skipped, as long as the line can be read).
_USED = {"hostname", "port", "user", "identityfile", "proxycommand", "proxyjump", "userknownhostsfile",
         "globalknownhostsfile", "stricthostkeychecking", "connecttimeout", "hostkeyalias", "hashknownhosts"}
_MATCH_SUPPORTED = {"all", "canonical", "final", "host", "originalhost", "user", "localuser"}
_MATCH_NO_ARGUMENT = {"all", "canonical", "final"}


def _words(text: str, origin: Origin) -> list[str]:
    """Split an ssh_config argument list: whitespace-separated, '…' and "…" quote, a word starting with # ends it."""
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        if text[i] == "#":
            break
        word = []
        while i < n and not text[i].isspace():
            if text[i] in "\"'":
                end = text.find(text[i], i + 1)
                if end < 0:
                    raise UsageError(f"{origin}: unterminated quote in ssh_config: {text.strip()}")
                word.append(text[i + 1:end])
                i = end + 1
            else:
                word.append(text[i])
                i += 1
        words.append("".join(word))
    return words


@functools.lru_cache(maxsize=4096)
def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower()),
                      re.DOTALL)


def _pattern_matches(pattern: str, text: str) -> bool:
    """OpenSSH's wildcard match: ``*`` and ``?`` only (``[`` is an ordinary character), case-insensitive."""
    return _pattern(pattern).fullmatch(text.lower()) is not None


def matches_pattern_list(patterns: list[str], text: str) -> bool:
    """True when ``text`` matches one of ``patterns`` and none of the negated (``!``) ones."""
    hit = False
    for pattern in patterns:
        if pattern.startswith("!"):
            if _pattern_matches(pattern[1:], text):
                return False
        elif _pattern_matches(pattern, text):
            hit = True
    return hit


def local_user() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "root"


@dataclass
class _Lookup:
    """State while reading ssh_config for one host (OpenSSH's readconf.c, the parts clusterrun uses)."""

    host: str  # as given: the inventory's host, an alias or an address
    user: str | None  # the inventory's user, like `ssh user@host`
    final: bool
    config: HostConfig = field(default_factory=HostConfig)
    wants_final: bool = False

    def match(self, text: str, origin: Origin) -> bool:
        words = _words(text, origin)
        if not words:
            raise UsageError(f"{origin}: Match needs a criterion (for example `Match host gpu*`)")
        result = True
        while words:
            word = words.pop(0)
            negate = word.startswith("!")
            criterion = word[1:].lower() if negate else word.lower()
            if criterion not in _MATCH_SUPPORTED:
                warn_once(log, f"{origin}: `Match {criterion}` is not supported by clusterrun: this Match block is "
                               "treated as not matching and its settings are not used (set them under a Host "
                               "line or in the inventory's ssh settings)")
                return False
            if criterion in _MATCH_NO_ARGUMENT:
                if criterion == "all":
                    passed = True
                elif criterion == "final":
                    self.wants_final = True
                    passed = self.final
                else:  # canonical: clusterrun does not canonicalize host names
                    passed = False
            else:
                if not words:
                    raise UsageError(f"{origin}: `Match {criterion}` needs an argument")
                patterns = words.pop(0).split(",")
                hostname = self.config.get("hostname")
                subject = {
                    "host": expand_tokens(hostname, {"h": self.host}, origin) if hostname else self.host,
                    "originalhost": self.host,
                    "user": self.user or self.config.get("user") or local_user(),
                    "localuser": local_user(),
                }[criterion]
                passed = matches_pattern_list(patterns, subject)
            if passed == negate:
                result = False  # keep reading: later criteria still get their checks and warnings
        return result

    def read(self, path: Path, *, system: bool, active: bool, never_match: bool, depth: int) -> None:
        for origin, keyword, rest, patterns in _config_lines(path):
            if keyword == "host":
                active = not never_match and matches_pattern_list(patterns, self.host)
            elif keyword == "match":
                matched = self.match(rest, origin)
                active = not never_match and matched
            elif keyword == "include":
                if active:
                    self.include(rest, origin, system=system, depth=depth)
            elif active:
                self.set(keyword, rest, origin)

    def include(self, rest: str, origin: Origin, *, system: bool, depth: int) -> None:
        if depth >= _MAX_INCLUDE_DEPTH:
            raise UsageError(f"{origin}: Include nested more than {_MAX_INCLUDE_DEPTH} deep (does a file include "
                             "itself?)")
        for name in _words(rest, origin):
            name = os.path.expanduser(name)
            if not os.path.isabs(name):
                name = os.path.join("/etc/ssh" if system else os.path.expanduser("~/.ssh"), name)
            for found in sorted(glob.glob(name)):
                if os.path.isfile(found):
                    # An included file starts in the including block's state and cannot leave it.
                    self.read(Path(found), system=system, active=True, never_match=False, depth=depth + 1)

    def set(self, keyword: str, rest: str, origin: Origin) -> None:
        config = self.config
        value = rest.strip() if keyword in _WHOLE_LINE else rest
        if not value.strip():
            if keyword in _USED:
                raise UsageError(f"{origin}: {keyword} needs a value")
            return
        if keyword == "identityfile":
            listed = {name for name, _ in config.identity_files}  # as OpenSSH, each file once
            config.identity_files += [(word, origin) for word in _words(value, origin) if word not in listed]
        elif keyword in ("proxycommand", "proxyjump"):
            # As OpenSSH: whichever of the two comes first wins, `none` included.
            if config.proxy is None:
                if keyword == "proxyjump":
                    words = _words(value, origin)
                    value = words[0] if words else ""
                config.proxy = Proxy("command" if keyword == "proxycommand" else "jump",
                                     None if value.lower() == "none" else value, origin)
        elif keyword not in config.values:
            config.values[keyword] = (value, origin)


_ConfigLine = tuple[Origin, str, str, list[str]]  # where, keyword (lower case), the rest, Host's patterns
_parsed: dict[tuple[str, int, int], list[_ConfigLine]] = {}
_parsed_lock = threading.Lock()


def _config_lines(path: Path) -> list[_ConfigLine]:
    """The lines of one ssh_config file that say something, split once per version of the file: every node of
    a large inventory looks itself up in the same files, and each lookup walks every Host line."""
    try:
        info = path.stat()
    except OSError:
        info = None
    if info is not None and not path.is_file():  # a FIFO or a device would block or never end
        raise UsageError(f"{path}: is not a regular file, so not read as an ssh_config")
    key = (str(path), info.st_mtime_ns, info.st_size) if info is not None else None
    with _parsed_lock:
        if key is not None and key in _parsed:
            return _parsed[key]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read this ssh_config: {exc}") from None
    lines: list[_ConfigLine] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        origin = Origin(str(path), lineno)
        parsed = _KEYWORD.fullmatch(stripped)
        if parsed is None:
            raise UsageError(f"{origin}: cannot read this ssh_config line: {stripped}")
        keyword, rest = parsed.group(1).lower(), parsed.group(2)
        patterns: list[str] = []
        if keyword == "host":
            patterns = _words(rest, origin)
            if not patterns:
                raise UsageError(f"{origin}: Host needs at least one pattern")
        lines.append((origin, keyword, rest, patterns))
    if key is not None:
        with _parsed_lock:
            if len(_parsed) > 64:
                _parsed.clear()
            _parsed[key] = lines
    return lines


def config_files(config_file: str | None) -> list[tuple[Path, bool]]:
    """The ssh_config files to read, in order, each with whether it is the system file."""
    if config_file:
        path = Path(os.path.expanduser(config_file))
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "not found"
            raise UsageError(f"{path}: ssh config_file {what} (set in the inventory's ssh settings or with "
                             "--ssh-config)")
        return [(path, False)]
    candidates = [(Path(os.path.expanduser(DEFAULT_CONFIG)), False), (Path(SYSTEM_CONFIG), True)]
    return [(path, system) for path, system in candidates if path.is_file()]


def lookup_config(host: str, files: list[tuple[Path, bool]], *, user: str | None = None) -> HostConfig:
    """The ssh_config values for ``host``, reading ``files`` in order (first value wins).

    ``user`` is the user given outside ssh_config (``Match user`` sees it). Raises UsageError naming the
    file and line of a line that cannot be read.
    """
    state = _Lookup(host, user, final=False)
    for path, system in files:
        state.read(path, system=system, active=True, never_match=False, depth=0)
    if state.wants_final:
        # `Match final` blocks apply in a second pass over the files, values of the first pass still first.
        final = _Lookup(host, user, final=True, config=state.config)
        for path, system in files:
            final.read(path, system=system, active=True, never_match=False, depth=0)
        return final.config
    return state.config


def expand_tokens(text: str, tokens: Mapping[str, str], origin: Origin | str) -> str:
    """Replace ``%x`` by ``tokens[x]`` and ``%%`` by ``%``; an unknown token is an error, as in OpenSSH."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "%" and i + 1 < len(text):
            key = text[i + 1]
            if key == "%":
                out.append("%")
            elif key in tokens:
                out.append(tokens[key])
            else:
                raise UsageError(f"{origin}: unknown token %{key} in {text!r} (supported here: "
                                 f"{', '.join('%' + k for k in sorted(tokens))})")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_path(text: str, tokens: Mapping[str, str], origin: Origin | str) -> str:
    """A file name from ssh_config: ``~``, ``${VAR}`` and ``%`` tokens expanded."""
    def env(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in os.environ:
            raise UsageError(f"{origin}: environment variable {name} in {text!r} is not set")
        return os.environ[name]

    return os.path.expanduser(expand_tokens(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", env, text), tokens, origin))


def parse_port(text: str, what: str, origin: Origin | str) -> int:
    """``text`` as a TCP port; raises UsageError naming ``origin`` and ``what`` if it is not one."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise UsageError(f"{origin}: {what}: port {text!r} is not a number from 1 to 65535")
    return int(text)
