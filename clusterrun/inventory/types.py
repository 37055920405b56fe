"""Reusable constrained types for inventory fields (pydantic ``Annotated`` aliases).

Each validator returns the normalised value or raises ``ValueError`` with one sentence
that says what was expected, so the loader can show it next to ``file:line``.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:bit|bit/s|b/s|bps)\s*$", re.IGNORECASE)
_RATE_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IFNAME_RE = re.compile(r"^[^\s/:]{1,15}$")


def parse_rate(value: object) -> int:
    """Turn ``'100gbit'``, ``'25Gb/s'`` or ``'200 mbit'`` into bits per second."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"expected a rate like '100gbit', got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"expected a positive rate like '100gbit', got {value!r}")
        return value
    m = _RATE_RE.match(value)
    if not m:
        raise ValueError(f"expected a rate like '100gbit', got {value!r}")
    bits = int(float(m.group(1)) * _RATE_SCALE[m.group(2).lower()])
    if bits <= 0:
        raise ValueError(f"expected a positive rate like '100gbit', got {value!r}")
    return bits


def format_rate(bits_per_second: int) -> str:
    """Inverse of :func:`parse_rate` for display: ``100000000000`` -> ``'100gbit'``."""
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_second >= scale:
            value = bits_per_second / scale
            return f"{value:g}{unit}"
    return f"{bits_per_second}bit"


def _check_name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(
            f"expected a name of letters, digits, '.', '_' or '-' (at most 63, not starting with a symbol), got {value!r}"
        )
    return value


def _check_ifname(value: str) -> str:
    if not _IFNAME_RE.match(value):
        raise ValueError(f"expected a network interface name like 'eth1' or 'enp65s0f0', got {value!r}")
    return value


def _check_env_name(value: str) -> str:
    if not _ENV_NAME_RE.match(value):
        raise ValueError(f"expected an environment variable name like 'NCCL_DEBUG', got {value!r}")
    return value


def _check_ip_or_cidr(value: object) -> str:
    """An address with an optional prefix length: ``10.0.0.1`` or ``10.0.0.1/24``."""
    if not isinstance(value, str):
        raise ValueError(f"expected an IP address like '10.0.0.1' or '10.0.0.1/24', got {value!r}")
    try:
        iface = ipaddress.ip_interface(value.strip())
    except ValueError:
        raise ValueError(f"expected an IP address like '10.0.0.1' or '10.0.0.1/24', got {value!r}") from None
    return str(iface) if "/" in value else str(iface.ip)


def _check_cidr(value: object) -> str:
    if not isinstance(value, str) or "/" not in value:
        raise ValueError(f"expected a subnet like '10.0.0.0/24', got {value!r}")
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise ValueError(f"expected a subnet like '10.0.0.0/24', got {value!r}") from None


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
NodeName = Annotated[str, AfterValidator(_check_name)]
IfName = Annotated[str, AfterValidator(_check_ifname)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]
EnvValue = Annotated[str, BeforeValidator(_env_value, json_schema_input_type=str | int | float | bool)]
IpOrCidr = Annotated[str, BeforeValidator(_check_ip_or_cidr)]
Cidr = Annotated[str, BeforeValidator(_check_cidr)]
