"""Hosts, GPUs and environment given on the command line.

* :func:`parse_ips`: ``--ips 10.0.0.1,gpu-02:2222,[fe80::1]:22`` (fleetrun style);
* :func:`parse_gpu_list`: ``--gpus 0,1,4-7``;
* :func:`parse_env_assignments`: repeated ``--env NCCL_DEBUG=INFO``;
* :func:`normalize_host`: the host rule shared with the hostfile and Slurm host lists.

All are pure: no DNS lookups, nothing read. Errors are :class:`UsageError` naming the
flag and the offending item.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass

from clusterrun.errors import UsageError

#: Highest GPU index accepted; the same bound as the inventory's ``GpuIndex``.
MAX_GPU_INDEX = 1023

#: Longest host accepted: a DNS name's limit. An ssh_config alias could be longer, but none is,
#: and the bound keeps a pasted block of text from becoming a host.
MAX_HOST_LENGTH = 253

#: Characters OpenSSH refuses in a host name given on its command line (they are special to
#: the shell that runs a ProxyCommand): ssh_valid_hostname() in OpenSSH's readconf.c.
_SHELL_CHARS = frozenset("'`\"$\\;&<>|(){},")
_DOTTED_NUMBERS_RE = re.compile(r"[0-9.]+")
_DIGITS_RE = re.compile(r"[0-9]+")
_GPU_ITEM_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IPS_EXAMPLE = "10.0.0.1,gpu-02:2222,[fe80::1]:22"
#: Lowest ``host:PORT`` accepted besides 22. ``host:N`` is how mpirun and Horovod write N slots (processes) on a
#: host, and slot counts are small numbers; ssh servers listen on 22 or on an unprivileged port (2222, 10022), not
#: on another port below 1024. So ``b:2`` is refused as a slot count instead of becoming ssh port 2.
MIN_SSH_PORT = 1024


@dataclass(frozen=True)
class HostSpec:
    """One host from ``--ips``: a host name, IPv4 or IPv6 address (no brackets), and an optional port."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def normalize_host(text: str) -> str:
    """Check one host: an IPv4 address, a bare IPv6 address, or a name ssh accepts.

    A name is whatever OpenSSH takes on its command line: DNS names, Slurm node names and
    ``~/.ssh/config`` aliases alike, underscores included (``gpu_01``). Refused are only
    names that would break: whitespace, control and invisible characters (NUL, a
    zero-width space), a leading ``-`` (ssh would read the name as an option), the
    characters ssh itself refuses in a host name because they are special to a shell (a
    ``ProxyCommand`` gets the name through ``%h``), and ``@`` (a user belongs in
    ``--ssh-user`` or ssh_config's ``User``), a first character that is neither a letter, a digit nor ``_``
    (``^node2``, ``*``, ``./x``: another tool's syntax), and names longer than :data:`MAX_HOST_LENGTH`.
    Nothing is looked up: no DNS, no file.

    Returns the host, with IP addresses in canonical form (``FE80:0::1`` -> ``fe80::1``)
    and names as written.
    Raises :class:`ValueError` with one sentence naming the text and what to write instead.
    """
    if not text:
        raise ValueError("the host is empty; give a host name or an IP address")
    if len(text) > MAX_HOST_LENGTH:
        raise ValueError(f"host {_quoted(text, 20)} is longer than {MAX_HOST_LENGTH} characters, the most a DNS "
                         "name may have; give the host's name or address")
    if ":" in text:
        try:
            return str(ipaddress.IPv6Address(text))
        except ValueError:
            raise ValueError(f"{text!r} is not a valid IPv6 address") from None
    if _DOTTED_NUMBERS_RE.fullmatch(text):
        # ssh would read 10.1 or 010.0.0.1 as an old-style IPv4 address (10.0.0.1, 8.0.0.1):
        # a name of digits and dots is meant as IPv4 and must be written in full.
        try:
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            raise ValueError(f"{text!r} is not a valid IPv4 address; write four numbers "
                             "from 0 to 255 without leading zeros, like 10.0.0.1") from None
    if any(ch.isspace() for ch in text):
        raise ValueError(f"host {text!r} holds whitespace; give one host name or address per item")
    # Control characters (NUL included) and invisible ones such as a zero-width space or a
    # byte-order mark: ssh or the resolver would fail on a name the user cannot see is wrong.
    hidden = next((ch for ch in text if unicodedata.category(ch) in ("Cc", "Cf")), None)
    if hidden is not None:
        kind = "control" if unicodedata.category(hidden) == "Cc" else "invisible"
        what = "a NUL character" if hidden == "\0" else f"the {kind} character {hidden!r}"
        raise ValueError(f"host {text!r} holds {what}; retype the host name (pasted text often "
                         "carries such characters)")
    if text.startswith("-"):
        raise ValueError(f"host {text!r} starts with '-', which ssh would read as an option; "
                         "give the host name without it")
    if "@" in text:
        raise ValueError(f"host {text!r} holds '@'; give the host alone and the user with --ssh-user "
                         "or User in ~/.ssh/config")
    if not (text[0].isalnum() or text[0] == "_"):
        # No host name, address or ssh_config alias in use starts so: such a name is another tool's syntax
        # (PRRTE's ^host exclusion, a glob, a path), which ssh would only fail to resolve.
        raise ValueError(f"host {text!r} starts with {text[0]!r}, which no host name does; a host name starts "
                         "with a letter or a digit")
    shell = sorted({ch for ch in text if ch in _SHELL_CHARS})
    if shell:
        raise ValueError(f"host {text!r} holds {', '.join(map(repr, shell))}, which ssh refuses in a host name; "
                         "give the host name or address alone")
    return text


def parse_ips(value: str, flag: str = "--ips") -> list[HostSpec]:
    """Parse comma-separated hosts: ``name``, ``name:port``, ``10.0.0.1``, ``10.0.0.1:22``,
    ``[fe80::1]``, ``[fe80::1]:2222`` or bare ``fe80::1`` (a bare IPv6 address has no port).

    Whitespace around items is ignored. Returns the hosts in the order given.
    Raises :class:`UsageError` naming ``flag`` and the item for: an empty value or item, an
    invalid host, a port that is not a number from 1 to 65535, a port below :data:`MIN_SSH_PORT`
    other than 22 (mpirun's ``host:slots``), or the same host and port twice (host names compared
    case-insensitively).
    """
    if not value.strip():
        raise UsageError(f"{flag}: no hosts given; list them separated by commas, like {flag} {_IPS_EXAMPLE}")
    specs: list[HostSpec] = []
    seen: dict[tuple[str, int | None], int] = {}
    for index, raw in enumerate(value.split(","), start=1):
        item = raw.strip()
        if not item:
            raise UsageError(f"{flag}: item {index} of {_quoted(value)} is empty; separate hosts with single commas, "
                             f"like {flag} {_IPS_EXAMPLE}")
        spec = _parse_ip_item(item, flag)
        key = (spec.host.lower(), spec.port)
        if key in seen:
            raise UsageError(f"{flag}: {_quoted(item)} is listed twice (items {seen[key]} and {index}); "
                             "list each host once")
        seen[key] = index
        specs.append(spec)
    return specs


def _parse_ip_item(item: str, flag: str) -> HostSpec:
    host, port_text = item, None
    if item.startswith("["):
        close = item.find("]")
        rest = item[close + 1:] if close != -1 else ""
        if close == -1 or (rest and not rest.startswith(":")):
            raise UsageError(f"{flag}: {_quoted(item)} is not a host: write an IPv6 address with a port as "
                             "[fe80::1]:2222")
        host, port_text = item[1:close], (rest[1:] if rest else None)
        if ":" not in host:
            raise UsageError(f"{flag}: {_quoted(item)}: brackets are only for IPv6 addresses; write "
                             + _clipped(host + (f":{port_text}" if port_text is not None else "")))
    elif item.count(":") == 1:
        host, port_text = item.split(":")
    # More than one ':' without brackets is a bare IPv6 address, which carries no port.
    if any(ch.isspace() for ch in host):
        raise UsageError(f"{flag}: {_quoted(item)} holds whitespace; separate hosts with commas, "
                         f"like {flag} {_IPS_EXAMPLE}")
    try:
        host = normalize_host(host)
    except ValueError as exc:
        hint = "; to give an IPv6 address a port, write [addr]:port" if ":" in host else ""
        where = "" if host == item else f"{_quoted(item)}: "
        raise UsageError(f"{flag}: {where}{exc}{hint}") from None
    return HostSpec(host, None if port_text is None else _parse_port(port_text, item, flag))


def _parse_port(text: str, item: str, flag: str) -> int:
    shown = _quoted(item)
    if not text:
        raise UsageError(f"{flag}: {shown}: the port after ':' is empty; write host:port, like gpu-02:2222")
    if not _DIGITS_RE.fullmatch(text):
        raise UsageError(f"{flag}: {shown}: port {_quoted(text)} is not a number; write host:port, like gpu-02:2222")
    port = _capped_int(text, 65535)
    if not 1 <= port <= 65535:
        raise UsageError(f"{flag}: {shown}: port {_clipped(text.lstrip('0') or '0')} is out of range; "
                         "use a port from 1 to 65535")
    if port < MIN_SSH_PORT and port != 22:
        host = item[:len(item) - len(text) - 1]
        raise UsageError(f"{flag}: {item}: MPI's slot count? clusterrun takes processes per node from "
                         f"--nproc-per-node (or a hostfile's slots=N); an ssh port is written {host}:2222 (ports "
                         f"below {MIN_SSH_PORT} other than 22 are taken for slot counts; for sshd on one, set Port "
                         "in ssh_config)")
    return port


def parse_gpu_list(value: str, flag: str = "--gpus") -> tuple[int, ...]:
    """Parse GPU indices: ``0,1,2,3``, ranges ``0-3``, or both (``0-1,4-5``), whitespace allowed around items.

    Returns the indices in the order given (it becomes ``CUDA_VISIBLE_DEVICES`` order).
    Raises :class:`UsageError` naming ``flag`` and the item for: an empty value or item, a
    negative or non-numeric index, a reversed range, an index above :data:`MAX_GPU_INDEX`,
    or an index given twice.
    """
    if not value.strip():
        raise UsageError(f"{flag}: no GPUs given; write indices like {flag} 0,1,2,3 or {flag} 0-3")
    gpus: list[int] = []
    seen: set[int] = set()
    for raw in value.split(","):
        item = raw.strip()
        m = _GPU_ITEM_RE.fullmatch(item)
        if m is None:
            what = ("is empty" if not item
                    else "is negative" if item.startswith("-")
                    else "is not an index or a range")
            raise UsageError(f"{flag}: {_quoted(item)} in {_quoted(value)} {what}; write indices like "
                             f"{flag} 0,1,2,3 or {flag} 0-3")
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        if max(_capped_int(lo_text, MAX_GPU_INDEX), _capped_int(hi_text, MAX_GPU_INDEX)) > MAX_GPU_INDEX:
            too_big = next(t for t in (hi_text, lo_text) if _capped_int(t, MAX_GPU_INDEX) > MAX_GPU_INDEX)
            raise UsageError(f"{flag}: {_quoted(item)}: GPU index {_clipped(too_big.lstrip('0'))} is above "
                             f"{MAX_GPU_INDEX}")
        lo, hi = int(lo_text.lstrip("0") or "0"), int(hi_text.lstrip("0") or "0")  # no 4300-digit limit
        if lo > hi:
            fix = f"write it as {hi_text}-{lo_text}" if len(item) <= 20 else "swap the bounds"
            raise UsageError(f"{flag}: {_quoted(item)} is a reversed range; {fix}")
        for gpu in range(lo, hi + 1):
            if gpu in seen:
                raise UsageError(f"{flag}: GPU {gpu} is given twice in {_quoted(value)}; list each GPU once")
            seen.add(gpu)
            gpus.append(gpu)
    return tuple(gpus)


def _capped_int(digits: str, cap: int) -> int:
    """``int(digits)``, or ``cap + 1`` when larger; never converts thousands of digits (Python refuses to)."""
    significant = digits.lstrip("0") or "0"
    return cap + 1 if len(significant) > len(str(cap)) else min(int(significant), cap + 1)


def _clipped(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _quoted(text: str, limit: int = 60) -> str:
    """``repr(text)``, cut to its first ``limit`` characters with its length when longer, so
    that one absurd value still gives a one-line message."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def parse_env_assignments(values: list[str], flag: str = "--env") -> dict[str, str]:
    """Parse repeated ``NAME=VALUE`` items; the value may be empty and may contain ``=``.

    Returns a dict in the order given.
    Raises :class:`UsageError` naming ``flag`` and the item for: a missing ``=``, a name that
    is not a POSIX variable name (letters, digits, ``_``, not starting with a digit), a
    value holding a NUL character, or a name given twice.
    """
    env: dict[str, str] = {}
    for item in values:
        name, sep, val = item.partition("=")
        shown = _quoted(item)
        if not sep:
            raise UsageError(f"{flag} {shown}: expected NAME=VALUE, like {flag} NCCL_DEBUG=INFO")
        if not _ENV_NAME_RE.fullmatch(name):
            raise UsageError(f"{flag} {shown}: {_quoted(name)} is not a valid variable name; use letters, digits "
                             "and '_', not starting with a digit, like NCCL_DEBUG")
        if "\0" in val:
            raise UsageError(f"{flag} {shown}: the value holds a NUL character, which no environment can carry")
        if name in env:
            raise UsageError(f"{flag} {shown}: {_clipped(name)} is already set to {_quoted(env[name])}; "
                             "give each variable once")
        env[name] = val
    return env
