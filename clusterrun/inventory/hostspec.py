"""Hosts, GPUs and environment given on the command line.

* :func:`parse_ips`: ``--ips 10.0.0.1,gpu-02:2222,[fe80::1]:22`` (fleetrun style);
* :func:`parse_gpu_list`: ``--gpus 0,1,4-7``;
* :func:`parse_env_assignments`: repeated ``--env NCCL_DEBUG=INFO``;
* :func:`normalize_host`: the host-name rule shared with the hostfile parser.

All are pure: no DNS lookups, nothing read. Errors are :class:`UsageError` naming the
flag and the offending item.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from clusterrun.errors import UsageError

#: Highest GPU index accepted; the same bound as the inventory's ``GpuIndex``.
MAX_GPU_INDEX = 1023

_LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_DOTTED_NUMBERS_RE = re.compile(r"[0-9.]+")
_DIGITS_RE = re.compile(r"[0-9]+")
_GPU_ITEM_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IPS_EXAMPLE = "10.0.0.1,gpu-02:2222,[fe80::1]:22"


@dataclass(frozen=True)
class HostSpec:
    """One host from ``--ips``: a host name, IPv4 or IPv6 address (no brackets), and an optional port."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def normalize_host(text: str) -> str:
    """Check one host: an RFC 1123 host name, an IPv4 address or a bare IPv6 address.

    Returns the host, with IP addresses in canonical form (``FE80:0::1`` -> ``fe80::1``)
    and host names as written.
    Raises :class:`ValueError` with one sentence saying what is wrong.
    """
    if not text:
        raise ValueError("the host is empty")
    if ":" in text:
        try:
            return str(ipaddress.IPv6Address(text))
        except ValueError:
            raise ValueError(f"{text!r} is not a valid IPv6 address") from None
    if _DOTTED_NUMBERS_RE.fullmatch(text):
        # RFC 1123 keeps host names from looking like dotted numbers, so this is meant as IPv4.
        try:
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            raise ValueError(f"{text!r} is not a valid IPv4 address") from None
    if len(text) > 253:
        raise ValueError(f"host name {text[:20]!r}... is longer than 253 characters")
    for label in text.split("."):
        if not _LABEL_RE.fullmatch(label):
            raise ValueError(f"{text!r} is not a valid host name: {_label_problem(label)} (RFC 1123)")
    return text


def _label_problem(label: str) -> str:
    if not label:
        return "it has an empty part between dots"
    if len(label) > 63:
        return f"the part {label[:20]!r}... is longer than 63 characters"
    bad = sorted({ch for ch in label if not (ch.isascii() and (ch.isalnum() or ch == "-"))})
    if bad:
        verb = "is" if len(bad) == 1 else "are"
        return f"{', '.join(map(repr, bad))} {verb} not allowed; use letters, digits and '-'"
    return "a part may not start or end with '-'"


def parse_ips(value: str, flag: str = "--ips") -> list[HostSpec]:
    """Parse comma-separated hosts: ``name``, ``name:port``, ``10.0.0.1``, ``10.0.0.1:22``,
    ``[fe80::1]``, ``[fe80::1]:2222`` or bare ``fe80::1`` (a bare IPv6 address has no port).

    Whitespace around items is ignored. Returns the hosts in the order given.
    Raises :class:`UsageError` naming ``flag`` and the item for: an empty value or item, an
    invalid host, a port that is not a number from 1 to 65535, or the same host and port
    twice (host names compared case-insensitively).
    """
    if not value.strip():
        raise UsageError(f"{flag}: no hosts given; list them separated by commas, like {flag} {_IPS_EXAMPLE}")
    specs: list[HostSpec] = []
    seen: dict[tuple[str, int | None], int] = {}
    for index, raw in enumerate(value.split(","), start=1):
        item = raw.strip()
        if not item:
            raise UsageError(f"{flag}: item {index} of {value!r} is empty; separate hosts with single commas, "
                             f"like {flag} {_IPS_EXAMPLE}")
        spec = _parse_ip_item(item, flag)
        key = (spec.host.lower(), spec.port)
        if key in seen:
            raise UsageError(f"{flag}: {item!r} is listed twice (items {seen[key]} and {index}); list each host once")
        seen[key] = index
        specs.append(spec)
    return specs


def _parse_ip_item(item: str, flag: str) -> HostSpec:
    host, port_text = item, None
    if item.startswith("["):
        close = item.find("]")
        rest = item[close + 1:] if close != -1 else ""
        if close == -1 or (rest and not rest.startswith(":")):
            raise UsageError(f"{flag}: {item!r} is not a host: write an IPv6 address with a port as [fe80::1]:2222")
        host, port_text = item[1:close], (rest[1:] if rest else None)
        if ":" not in host:
            raise UsageError(f"{flag}: {item!r}: brackets are only for IPv6 addresses; write {host}"
                             + (f":{port_text}" if port_text is not None else ""))
    elif item.count(":") == 1:
        host, port_text = item.split(":")
    # More than one ':' without brackets is a bare IPv6 address, which carries no port.
    if any(ch.isspace() for ch in host):
        raise UsageError(f"{flag}: {item!r} holds whitespace; separate hosts with commas, like {flag} {_IPS_EXAMPLE}")
    try:
        host = normalize_host(host)
    except ValueError as exc:
        hint = "; to give an IPv6 address a port, write [addr]:port" if ":" in host else ""
        where = "" if host == item else f"{item!r}: "
        raise UsageError(f"{flag}: {where}{exc}{hint}") from None
    return HostSpec(host, None if port_text is None else _parse_port(port_text, item, flag))


def _parse_port(text: str, item: str, flag: str) -> int:
    if not text:
        raise UsageError(f"{flag}: {item!r}: the port after ':' is empty; write host:port, like gpu-02:2222")
    if not _DIGITS_RE.fullmatch(text):
        raise UsageError(f"{flag}: {item!r}: port {text!r} is not a number; write host:port, like gpu-02:2222")
    port = int(text)
    if not 1 <= port <= 65535:
        raise UsageError(f"{flag}: {item!r}: port {port} is out of range; use a port from 1 to 65535")
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
            raise UsageError(f"{flag}: {item!r} in {value!r} {what}; write indices like {flag} 0,1,2,3 "
                             f"or {flag} 0-3")
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else int(m.group(2))
        if lo > hi:
            raise UsageError(f"{flag}: {item!r} is a reversed range; write it as {m.group(2)}-{m.group(1)}")
        if hi > MAX_GPU_INDEX:
            raise UsageError(f"{flag}: {item!r}: GPU index {hi} is above {MAX_GPU_INDEX}")
        for gpu in range(lo, hi + 1):
            if gpu in seen:
                raise UsageError(f"{flag}: GPU {gpu} is given twice in {value!r}; list each GPU once")
            seen.add(gpu)
            gpus.append(gpu)
    return tuple(gpus)


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
        if not sep:
            raise UsageError(f"{flag} {item!r}: expected NAME=VALUE, like {flag} NCCL_DEBUG=INFO")
        if not _ENV_NAME_RE.fullmatch(name):
            raise UsageError(f"{flag} {item!r}: {name!r} is not a valid variable name; use letters, digits "
                             "and '_', not starting with a digit, like NCCL_DEBUG")
        if "\0" in val:
            raise UsageError(f"{flag} {item!r}: the value holds a NUL character, which no environment can carry")
        if name in env:
            raise UsageError(f"{flag} {item!r}: {name} is already set to {env[name]!r}; give each variable once")
        env[name] = val
    return env
