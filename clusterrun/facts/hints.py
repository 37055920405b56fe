"""What to check when a failed rank's log shows a known NCCL, Gloo or rendezvous failure.

Hints come most specific first: what the log proves about the cause (NCCL's sockets on the loopback
interface, the ranks torch's desync report names) before what a failure line only suggests (a
timeout, a refused connection), so the hint that names the culprit is the one a user reads first.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from clusterrun.facts.parsers import nccl_log

# Gloo and torch's c10d store print their own messages; NCCL's are handled by the NCCL log parser.
_OTHER = (
    (re.compile(r"Connection refused", re.I),
     "a peer refused the connection: the master (rank 0) was not listening yet or had already died, or a "
     "firewall rejects the port; check MASTER_ADDR/--master-port and that rank 0 started"),
    (re.compile(r"No route to host|Network is unreachable", re.I),
     "no route between nodes on the data network: check the data subnet in the inventory and each node's "
     "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (clusterrun plan shows them)"),
    (re.compile(r"(timed out|Timeout|DistStoreError).*(store|rendezvous|connect|client)|"
                r"(store|rendezvous).*(timed out|timeout)", re.I),
     "the rendezvous timed out: a node never joined (did every node start? see its launcher.log), or traffic "
     "to the master port is dropped by a firewall"),
    (re.compile(r"Gloo connectFullMesh failed|gloo.*(Timed out|Connection reset)", re.I),
     "Gloo could not connect all ranks: the interface in GLOO_SOCKET_IFNAME may be up but unable to reach "
     "its peers (MTU, firewall, wrong subnet); check with `clusterrun plan` and ping across the data NIC"),
    (re.compile(r"Watchdog caught collective operation timeout", re.I),
     "a collective hung until the watchdog fired: one rank was slower or stuck (busy GPU, data loading) or "
     "the network dropped traffic; compare the other ranks' last lines"),
)

# --- NCCL on the loopback interface ---------------------------------------------------------------------------------

# The interfaces NCCL says it uses, in every format NCCL has printed:
#   Bootstrap : Using eth0:10.0.0.2<0>                 (2.7 and older: "Bootstrap : Using [0]eth0:...<0> [1]...")
#   NET/Socket : Using [0]lo:127.0.0.1<0> [1]eth0:172.17.0.2<0>   (or a socket plugin: NET/FastSocket)
#   NET : Using interface lo:127.0.0.1<0>              (before 2.4, one line per interface)
#   NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB eth0:10.2.0.4<0>  (only the OOB interface has an address)
_USING = re.compile(r"(?:Bootstrap|NET(?:/\w+)?) : Using (?:interface )?(?P<list>.*)$")
_INTERFACE = re.compile(r"(?:\[\d+\])?(?P<name>[\w.@-]+):(?P<addr>[0-9A-Fa-f.:%\w-]+)<\d+>")
# What a job that cannot reach its peers ends in: a connect that failed or timed out, a refused or reset
# connection, a rendezvous or store timeout, or the watchdog giving up on a collective.
_UNREACHED = re.compile(r"timed? ?out\b|\btimeout\b|refused|unreachable|no route to host|connection (?:reset|closed)|"
                        r"connect.*fail|DistStoreError|DistNetworkError|connectFullMesh", re.I)


def chosen_interfaces(text: str) -> list[tuple[str, str]]:
    """Every ``(name, address)`` NCCL says it uses for sockets or bootstrap in ``text``, first seen first."""
    found: dict[tuple[str, str], None] = {}
    for line in text.splitlines():
        if "NCCL" not in line:
            continue
        match = _USING.search(line)
        if match is None:
            continue
        for iface in _INTERFACE.finditer(match["list"]):
            found[(iface["name"], iface["addr"])] = None
    return list(found)


def _is_loopback(name: str, address: str) -> bool:
    return name == "lo" or address.startswith("127.") or address in ("::1", "0:0:0:0:0:0:0:1")


# Bridges of containers and VMs carry an IPv4 address no other node routes to.
_VIRTUAL = re.compile(r"^(?:docker|veth|virbr|br-|cni|flannel|cali)")


def _ipv4(address: str) -> bool:
    try:
        return ipaddress.ip_interface(address.split("%")[0]).version == 4
    except ValueError:
        return False


def _usable_nic(nics: Sequence[tuple[str, str]], chosen: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """A NIC to name in the advice: one the node has (``nics``, best first) or, failing that, one NCCL listed,
    that is not the loopback and has an IPv4 address (an interface with only an IPv6 link-local address,
    fe80::..., cannot carry NCCL's traffic to other nodes)."""
    return next(((name, addr.split("/")[0]) for name, addr in (*nics, *chosen)
                 if name and not _is_loopback(name, addr) and not _VIRTUAL.match(name) and _ipv4(addr)), None)


def _loopback_hint(text: str, parsed: nccl_log.NcclLog | None, nics: Sequence[tuple[str, str]]) -> str | None:
    """NCCL sockets on ``lo`` in a log that ends in a connection or rendezvous timeout: the cause, named."""
    if parsed is not None and parsed.nnodes == 1:
        return None  # one node: loopback is a fine choice, the timeout has another cause
    chosen = chosen_interfaces(text)
    loop = [(name, addr) for name, addr in chosen if _is_loopback(name, addr)]
    if not loop or not _UNREACHED.search(text):
        return None
    name, addr = loop[0]
    names = list(dict.fromkeys(n for n, _ in chosen))
    among = f" (of {', '.join(names)})" if len(names) > 1 else ""
    ifname = parsed.socket_ifname if parsed is not None else None
    cause = (f"NCCL_SOCKET_IFNAME={ifname} (from the environment or nccl.conf) makes NCCL use the loopback "
             f"interface {name}:{addr}" if ifname is not None and ifname.lstrip("=") == name else
             f"NCCL uses the loopback interface {name}:{addr}{among}")
    usable = _usable_nic(nics, chosen)
    which = (f"such as {usable[0]}, which has {usable[1]}" if usable is not None else
             "the interface that `ip -4 addr` shows with the node's address on the data network")
    return (f"{cause}, which no other node can reach, so connections to it time out: set NCCL_SOCKET_IFNAME to "
            f"the data NIC's name on every node ({which}; never {name}), or at least exclude it "
            f"(NCCL_SOCKET_IFNAME=^{name},docker); `clusterrun plan` shows the value clusterrun sets and "
            "clusterrun doctor the one that works")


# --- torch's desync report (TORCH_NCCL_DESYNC_DEBUG=1) -------------------------------------------------------------

# The phrases of torch's retrieveDesyncReport (torch/csrc/distributed/c10d/TraceUtils.h):
#   - To our best knowledge, ranks [3, 5] are the lagging ranks that caused this timeout. They never joined ...
#   - [47] joined but didn't finish collective #41207 (count from 1)
#     [7] finished collective #182, but didn't join collective #183 (count from 1)
_RANKS = r"\[(?P<ranks>\d+(?:,\s*\d+)*)\]"
_NEVER_ANY = re.compile(r"ranks " + _RANKS + r" are the lagging ranks that caused this timeout")
_STUCK_IN = re.compile(_RANKS + r" joined but didn't finish collective #(?P<seq>\d+)")
_NOT_JOINED = re.compile(_RANKS + r" finished collective #(?P<done>\d+), but didn't join collective #(?P<seq>\d+)")


def _ranks(match: re.Match[str]) -> str:
    ranks = [r.strip() for r in match["ranks"].split(",")]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(ranks)


def _desync_hint(text: str) -> str | None:
    """The rank(s) torch's desync report blames, and what to look at on them."""
    look = ("read {who}'s log and the stack it hangs in (clusterrun up --hang-timeout takes every rank's stack "
            "when the job goes silent)")
    if match := _NEVER_ANY.search(text):
        who = _ranks(match)
        return (f"the desync report names {who} as never joining any collective: it died, hung or is still "
                f"loading before its first collective; " + look.format(who=who))
    if match := _STUCK_IN.search(text):  # the others may have finished that collective: they wait on this one
        who = _ranks(match)
        return (f"the desync report names {who} as joining collective #{match['seq']} but never finishing it: "
                f"its GPU or its network path to the others is stuck; " + look.format(who=who))
    if match := _NOT_JOINED.search(text):
        who = _ranks(match)
        return (f"the desync report names {who} as never joining collective #{match['seq']} (after finishing "
                f"#{match['done']}) while the other ranks went on: it is stuck before that collective (data "
                f"loading, a hung GPU, an exception caught and ignored) or takes a rank-dependent branch that "
                f"skips it; " + look.format(who=who))
    return None


def failure_hints(lines: list[str], limit: int = 3, nics: Sequence[tuple[str, str]] = ()) -> list[str]:
    """Up to ``limit`` distinct hints for the known failures in ``lines`` (most specific first).

    ``nics`` are the failed node's ``(name, address)`` pairs when the caller knows them (its data NIC
    first); a hint that must name an interface names one of those with an IPv4 address, else one from
    NCCL's own list, else none.
    """
    text = "\n".join(lines)
    parsed: nccl_log.NcclLog | None
    try:
        parsed = nccl_log.parse(text)
    except Exception:  # a log is not a contract: never let a hint break the summary
        parsed = None
    hints = [hint for hint in (_loopback_hint(text, parsed, nics), _desync_hint(text)) if hint]
    if parsed is not None:
        hints += [f.hint for f in parsed.failures if f.hint]
    hints += [hint for pattern, hint in _OTHER if pattern.search(text)]
    unique = list(dict.fromkeys(hints))
    return unique[:limit]
