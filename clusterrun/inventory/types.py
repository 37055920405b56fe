"""Reusable constrained types for inventory fields (pydantic ``Annotated`` aliases).

Each validator returns the normalised value or raises ``ValueError`` with one sentence
that says what was expected, so the loader can show it next to ``file:line``.

Every string the inventory takes refuses control characters (NUL, escape sequences,
carriage returns, ...): no process can be given a NUL, and the others would reach a
command line, a log or the terminal as something else than what the file seems to say.
Only environment values may hold tabs and line breaks, which multi-line values need.
Numbers have upper bounds, so a typo of a few extra digits is an error here rather
than a failure at launch.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

#: Fastest link rate accepted (bits per second): 100 Tbit/s, far beyond any NIC.
MAX_RATE = 10**14
#: Longest wait accepted for a timeout in the inventory (seconds): one week.
MAX_TIMEOUT = 7 * 24 * 3600
#: Most nodes an inventory may describe (the same bound as a Slurm host list's expansion).
MAX_NODES = 65536

_RATE_RE = re.compile(r"\s*([0-9]{1,15}(?:\.[0-9]{1,15})?)\s*([kmgt]?)(?:bit|bit/s|b/s|bps)\s*", re.IGNORECASE)
_RATE_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IFNAME_RE = re.compile(r"[^\s/:\x00-\x1f\x7f-\x9f]{1,15}")
# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ENV_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")  # tab and newline allowed
_CONTROL_NAMES = {"\x00": "NUL", "\x1b": "ESC", "\r": "carriage return", "\n": "newline", "\t": "tab",
                  "\x7f": "DEL", "\u2028": "line separator", "\u2029": "paragraph separator"}


def brief_repr(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to about ``limit`` characters: how messages quote what a user wrote.

    ``repr`` escapes control characters, so a hostile value cannot break the message's line or
    drive the terminal; the cut keeps a value of megabytes from flooding it.
    """
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    try:
        text = repr(value)
    except ValueError:  # an int too long to print (Python refuses more than 4300 digits)
        return f"a number of about {int(value.bit_length() * 0.30103) if isinstance(value, int) else '?'} digits"
    return text if len(text) <= limit + 20 else f"{text[:limit]}... ({len(text)} characters)"


def control_character_problem(value: str, *, line_breaks: bool = False) -> str | None:
    """The first control character of ``value``, as the end of a sentence, or None when it holds none.

    ``line_breaks`` allows tab and newline (environment values). Returns ``"holds the control
    character ESC ('\\x1b') at position 3 of ...; remove it: ..."``, for the caller to start
    with what the value is ("the value ", "the host ").
    """
    m = (_ENV_CONTROL_RE if line_breaks else _CONTROL_RE).search(value)
    if m is None:
        return None
    ch = m.group()
    name = _CONTROL_NAMES.get(ch, f"U+{ord(ch):04X}")
    return (f"holds the control character {name} ({ch!r}) at position {m.start() + 1} of {brief_repr(value)}; "
            "remove it: control characters cannot be passed on safely")


def _check_text(value: str) -> str:
    problem = control_character_problem(value)
    if problem:
        raise ValueError(f"the text {problem}")
    return value


def _check_env_text(value: str) -> str:
    problem = control_character_problem(value, line_breaks=True)
    if problem:
        raise ValueError(f"the value {problem}")
    return value


def parse_rate(value: object) -> int:
    """Turn ``'100gbit'``, ``'25Gb/s'`` or ``'200 mbit'`` into bits per second."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"expected a rate like '100gbit', got {brief_repr(value)}")
    if isinstance(value, int):
        bits = value
    else:
        m = _RATE_RE.fullmatch(value)
        if not m:
            raise ValueError(f"expected a rate like '100gbit', got {brief_repr(value)}")
        bits = int(float(m.group(1)) * _RATE_SCALE[m.group(2).lower()])
    if bits <= 0:
        raise ValueError(f"expected a positive rate like '100gbit', got {brief_repr(value)}")
    if bits > MAX_RATE:
        raise ValueError(f"a rate of {brief_repr(value)} is above {format_rate(MAX_RATE)}, faster than any link; "
                         "write the link's rate with its unit, like '100gbit'")
    return bits


def format_rate(bits_per_second: int) -> str:
    """Inverse of :func:`parse_rate` for display: ``100000000000`` -> ``'100gbit'``."""
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_second >= scale:
            value = bits_per_second / scale
            return f"{value:g}{unit}"
    return f"{bits_per_second}bit"


def _check_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise ValueError(
            "expected a name of letters, digits, '.', '_' or '-' (at most 63, not starting with a symbol), "
            f"got {brief_repr(value)}"
        )
    return value


def _check_ifname(value: str) -> str:
    if not _IFNAME_RE.fullmatch(value):
        raise ValueError(f"expected a network interface name like 'eth1' or 'enp65s0f0', got {brief_repr(value)}")
    return value


def _check_env_name(value: str) -> str:
    if not _ENV_NAME_RE.fullmatch(value):
        raise ValueError(f"expected an environment variable name like 'NCCL_DEBUG', got {brief_repr(value)}")
    return value


def _check_ip_or_cidr(value: object) -> str:
    """An address with an optional prefix length: ``10.0.0.1`` or ``10.0.0.1/24``."""
    if not isinstance(value, str):
        raise ValueError(f"expected an IP address like '10.0.0.1' or '10.0.0.1/24', got {brief_repr(value)}")
    try:
        iface = ipaddress.ip_interface(value.strip())
    except ValueError:
        raise ValueError(f"expected an IP address like '10.0.0.1' or '10.0.0.1/24', got {brief_repr(value)}") from None
    return str(iface) if "/" in value else str(iface.ip)


def _check_cidr(value: object) -> str:
    if not isinstance(value, str) or "/" not in value:
        raise ValueError(f"expected a subnet like '10.0.0.0/24', got {brief_repr(value)}")
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise ValueError(f"expected a subnet like '10.0.0.0/24', got {brief_repr(value)}") from None


def _env_value(value: object) -> str:
    # YAML turns `NCCL_DEBUG: 1` into an int and `X: yes` into a bool; the environment
    # only holds strings, so accept scalars and spell them the way a shell would.
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"expected a string value, got {type(value).__name__}")


Rate = Annotated[int, BeforeValidator(parse_rate, json_schema_input_type=str | int), Field(description="link rate, e.g. '100gbit', '25gbit', '200mbit'")]
Port = Annotated[int, Field(ge=1, le=65535)]
GpuIndex = Annotated[int, Field(ge=0, le=1023)]
#: Any free text of the inventory (paths, user names, labels, ...): no control characters.
Text = Annotated[str, AfterValidator(_check_text)]
NodeName = Annotated[str, AfterValidator(_check_name)]
IfName = Annotated[str, AfterValidator(_check_ifname)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]
EnvValue = Annotated[str, BeforeValidator(_env_value, json_schema_input_type=str | int | float | bool),
                     AfterValidator(_check_env_text)]
IpOrCidr = Annotated[str, BeforeValidator(_check_ip_or_cidr)]
Cidr = Annotated[str, BeforeValidator(_check_cidr)]


def format_path(path: tuple[str | int, ...]) -> str:
    """Where in the inventory a value sits, as a user writes it: ``nodes[1].nics[0].ip``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).isprintable() or len(str(part)) > 60:
            out += f"[{brief_repr(part)}]"  # a key with control characters must not break the message's line
        else:
            out += f".{part}" if out else str(part)
    return out or "inventory"


def check_rank_order(value: str) -> str:
    """``inventory`` or ``label:KEY``, as given; ValueError with the valid forms otherwise."""
    value = value.strip()
    key = value[len("label:"):] if value.startswith("label:") else None
    if value == "inventory" or (key and key.replace("-", "").replace("_", "").replace(".", "").isalnum()):
        return value
    raise ValueError(f"expected 'inventory' or 'label:KEY' (e.g. label:switch, for nodes labelled switch=s1), "
                     f"got {brief_repr(value)}")


def labels_from_mapping(value: object) -> object:
    # `labels: {switch: s1}` is `labels: [switch=s1]`: a key=value label, as rank_order: label:switch reads it.
    if isinstance(value, dict):
        return [f"{k}={v}" for k, v in value.items()]
    return value
