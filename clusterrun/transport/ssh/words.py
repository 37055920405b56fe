"""The words of ssh_config as OpenSSH reads them: where a value came from, argument lists, Host patterns,
``%`` tokens, file names and ports. Shared by the config reader, target resolution and known_hosts."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pwd
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from clusterrun.errors import UsageError

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
        return f"{self.path}:{self.line}" if self.line else self.path  # line 0: known only as a whole


def split_words(text: str, origin: Origin) -> list[str]:
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
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.DOTALL)


def _pattern_matches(pattern: str, text: str, case_sensitive: bool) -> bool:
    """OpenSSH's wildcard match: ``*`` and ``?`` only (``[`` is an ordinary character)."""
    if not case_sensitive:
        pattern, text = pattern.lower(), text.lower()
    return _pattern(pattern).fullmatch(text) is not None


def matches_pattern_list(patterns: list[str], text: str, *, case_sensitive: bool = False) -> bool:
    """True when ``text`` matches one of ``patterns`` and none of the negated (``!``) ones.

    OpenSSH compares host names case-insensitively (``Match host``, known_hosts), but a ``Host`` line's patterns
    with the name exactly as given (``Host gpu*`` does not apply to ``ssh GPU1``): ``case_sensitive`` for those.
    """
    hit = False
    for pattern in patterns:
        if pattern.startswith("!"):
            if _pattern_matches(pattern[1:], text, case_sensitive):
                return False
        elif _pattern_matches(pattern, text, case_sensitive):
            hit = True
    return hit


def _account() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(os.getuid())
    except KeyError:
        return None


def _account_name() -> str | None:
    """The password database's name for this uid (as OpenSSH's ``getpwuid``), else ``$USER``/``$LOGNAME``."""
    entry = _account()
    if entry is not None:
        return entry.pw_name
    return os.environ.get("USER") or os.environ.get("LOGNAME") or None


def local_user() -> str:
    """The user ``ssh`` connects as when none is set, and ``Match user``/``localuser`` and ``%u`` see: the
    password database's entry of this uid, whatever ``$USER`` and ``$LOGNAME`` say (unset in containers and
    cron). Only a uid with no entry falls back to them (``ssh`` itself refuses to run then)."""
    name = _account_name()
    if name is None:
        raise UsageError(f"uid {os.getuid()} has no entry in the password database and $USER and $LOGNAME are "
                         "unset, so there is no user to connect as (ssh refuses too: \"No user exists for uid\"); "
                         "set the SSH user: user in the inventory's ssh settings, or --ssh-user")
    return name


def ssh_home() -> str:
    """The home directory ``ssh`` uses for ``~`` and ``~/.ssh``: the password database's, which ``$HOME`` does
    not change (``$HOME`` only where this uid has no entry)."""
    entry = _account()
    return entry.pw_dir if entry is not None else os.path.expanduser("~")


def expand_home(path: str) -> str:
    """``~`` as ``ssh`` expands it in ssh_config: the password database's home (``~user`` that user's)."""
    if path == "~" or path.startswith("~/"):
        return os.path.join(ssh_home(), path[2:]) if len(path) > 2 else ssh_home()
    return os.path.expanduser(path)


def session_tokens(hostname: str, host: str, port: int | str, user: str, host_key_alias: str | None = None
                   ) -> dict[str, str]:
    """The ``%`` tokens OpenSSH offers in file names, ``Match exec`` and the like, for one connection."""
    local_host = os.uname().nodename
    return {"h": hostname, "n": host, "p": str(port), "r": user, "u": _account_name() or str(os.getuid()),
            "d": ssh_home(),
            "i": str(os.getuid()), "L": local_host.split(".")[0], "l": local_host, "k": host_key_alias or host,
            # As OpenSSH 9.2: the SHA-1 of %l%h%p%r (names a ControlPath or a key per connection).
            "C": hashlib.sha1(f"{local_host}{hostname}{port}{user}".encode()).hexdigest()}


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
    """A file name from ssh_config: ``~`` (as ``ssh`` does: the password database's home), ``${VAR}`` and ``%``
    tokens expanded."""
    def env(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in os.environ:
            raise UsageError(f"{origin}: environment variable {name} in {text!r} is not set")
        return os.environ[name]

    return expand_home(expand_tokens(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", env, text), tokens, origin))


def parse_port(text: str, what: str, origin: Origin | str) -> int:
    """``text`` as a TCP port; raises UsageError naming ``origin`` and ``what`` if it is not one."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise UsageError(f"{origin}: {what}: port {text!r} is not a number from 1 to 65535")
    return int(text)
