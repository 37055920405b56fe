"""What a log tail says about NCCL: version, chosen network and devices, rings, and known failures.

Input is any log written with ``NCCL_DEBUG=INFO`` (or WARN): a rank's output, a torchrun
log, mixed with the training script's own lines. Lines without NCCL's markers are
ignored, so a tail with no NCCL line parses to an empty :class:`NcclLog` (NCCL_DEBUG
unset, or the job died before NCCL started); ``nccl_lines`` tells which. Each known
failure becomes a :class:`Finding` with a hint; an unknown ``NCCL WARN`` line is still
reported (kind OTHER_WARN), never dropped.

The network and its devices, in the forms NCCL has printed them::

    NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.2.0.4<0>     (2.4 and later; NET/Socket alike)
    Using network IB
    NET : Using interface enp1s0f0:100.97.16.164<0>     (before 2.4: one line per interface found, then:)
    NET/Socket : 1 interfaces found                     (those interfaces are the socket transport's)
    NET/IB : Using interface enp1s0f0 for sideband communication     (the IB transport's OOB interface)
    NET/IB: [0] mlx5_3:1/IB                             (one line per HCA port)
    Using internal Network IB

The oldest (2.0 to 2.2) print ``host:pid:tid [dev] INFO ...`` without the word NCCL. The network is the one
NCCL says it uses (``Using network``), else the last one that listed devices; its devices are the last it listed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import Enum

from clusterrun.errors import ParseError

TOOL = "NCCL log"


class FailureKind(Enum):
    SOCKET_CONNECT = "socket_connect"
    NO_SOCKET_INTERFACE = "no_socket_interface"
    SHM_NO_SPACE = "shm_no_space"
    IB_COMPLETION_ERROR = "ib_completion_error"
    MEMLOCK = "memlock"
    TIMEOUT = "timeout"
    UNHANDLED_SYSTEM_ERROR = "unhandled_system_error"
    REMOTE_ERROR = "remote_error"
    INTERNAL_ERROR = "internal_error"
    OTHER_WARN = "other_warn"


_IFNAME_HINT = ("set NCCL_SOCKET_IFNAME to the data NIC's name on every node (a name or prefix such as eth1, "
                "not an IP address); clusterrun doctor prints the recommended value")
_RULES: tuple[tuple[FailureKind, re.Pattern[str], str], ...] = (
    (FailureKind.SOCKET_CONNECT,
     re.compile(r"(?:socketStartConnect|socketPollConnect|socketConnect|Connect to).*?"
                r"(?:failed|returned \d+\()|Call to connect returned Connection refused"),
     "NCCL could not open a TCP connection to a peer: a firewall drops NCCL's ports, or NCCL picked an "
     "interface the peer cannot reach; " + _IFNAME_HINT),
    (FailureKind.NO_SOCKET_INTERFACE, re.compile(r"Bootstrap : no socket interface found"),
     "no interface matched NCCL_SOCKET_IFNAME (or only loopback/docker ones exist); " + _IFNAME_HINT),
    (FailureKind.SHM_NO_SPACE, re.compile(r"/dev/shm.*No space left on device|Error while creating shared memory"),
     "/dev/shm is too small for NCCL (containers default to 64 MB): docker run --shm-size=1g (or "
     "--ipc=host), or mount a larger tmpfs at /dev/shm"),
    (FailureKind.IB_COMPLETION_ERROR, re.compile(r"NET/IB : Got completion (?:from peer \S+ )?with error"),
     "an InfiniBand transfer failed (error 12 = retry exceeded: the nodes have no working IB path, e.g. "
     "different fabric or partition, or a port down); run clusterrun doctor's ib_write_bw check between them"),
    (FailureKind.MEMLOCK, re.compile(r"ibv_reg_mr failed|ibv_create_cq failed|Cannot allocate memory"),
     "RDMA memory registration failed: the locked-memory limit is too low (ulimit -l unlimited; docker "
     "--ulimit memlock=-1)"),
    (FailureKind.TIMEOUT, re.compile(r"Watchdog caught collective operation timeout|[Tt]imed? ?out after|"
                                     r"NCCL timeout|ProcessGroupNCCL.*[Tt]imeout"),
     "a collective did not finish in time: a rank is stuck or the network path between two nodes is broken; "
     "look at the other ranks' logs and run clusterrun doctor"),
    (FailureKind.UNHANDLED_SYSTEM_ERROR, re.compile(r"unhandled system error"),
     "a system call failed inside NCCL (often a socket error, /dev/shm or memlock limit); the NCCL WARN line "
     "before it (NCCL_DEBUG=INFO) names the call"),
    (FailureKind.REMOTE_ERROR, re.compile(r"remote process exited or there was a network error"),
     "a peer rank died or its network failed: the first failing rank's log has the cause"),
    (FailureKind.INTERNAL_ERROR, re.compile(r"NCCL error.*internal error"),
     "NCCL failed during setup; the NCCL WARN lines above it (NCCL_DEBUG=INFO) say where"),
)
# WARN lines that do not stop NCCL: it falls back to sockets when libibverbs is absent.
_BENIGN_WARN = re.compile(r"Failed to open libibverbs")
_NET_USING = re.compile(r"NET/(?P<net>(?!Plugin)\w+) : Using (?!interface )(?P<list>.*)$")
# NCCL before 2.4 (see the module's text); NCCL 2.0 to 2.2 also left "NCCL" out of the line's prefix.
_OLD_LINE = re.compile(r":\d+:\d+ \[\d+\] (?:\S+:\d+ )?(?P<level>INFO|WARN) ")
_OLD_IFACE = re.compile(r"NET : Using interface (?P<name>[\w.@-]+)(?::(?P<addr>[^<\s]+)<\d+>)?")
_OLD_FOUND = re.compile(r"NET/(?P<net>\w+) : (?P<n>\d+) interfaces? found")
_OLD_SIDEBAND = re.compile(r"NET/IB : Using interface (?P<name>[\w.@-]+) for sideband communication")
_OLD_IB_DEV = re.compile(r"NET/IB: \[(?P<i>\d+)\] (?P<name>[\w.-]+):(?P<port>\d+)/(?P<kind>IB|RoCE)")
_USING_NETWORK = re.compile(r"Using (?:internal )?[Nn]etwork (\w+)")
_SOCKET_DEV = re.compile(r"^\[(?P<i>\d+)\](?P<name>[\w.@-]+):(?P<addr>[^<\s]+)<\d+>$")
_IB_DEV = re.compile(r"^\[(?P<i>\d+)\](?P<name>[\w.-]+):(?P<port>\d+)/(?P<kind>IB|RoCE)$")
_BOOTSTRAP = re.compile(r"Bootstrap ?: Using (?:\[0\])?(?P<name>[\w.@-]+):(?P<addr>[^<\s]+)<\d+>")
_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+\S*)")
_RING = re.compile(r"NCCL INFO Channel \d+/(?P<n>\d+) :(?:\s+\d+)+\s*$")
_NRANKS = re.compile(r"\brank \d+ n[Rr]anks (?P<n>\d+)(?: nNodes (?P<nodes>\d+))?")
_IFNAME_ENV = re.compile(r"NCCL_SOCKET_IFNAME set by environment to (?P<v>\S+)")


@dataclass(frozen=True)
class NetDevice:
    """A device from a ``NET/<x> : Using`` line: ``[0]eth0:10.0.0.23`` or ``[0]mlx5_0:1/IB``."""

    index: int
    name: str
    address: str | None = None  # sockets
    port: int | None = None  # IB/RoCE HCA port
    link: str | None = None  # IB or RoCE


@dataclass(frozen=True)
class Finding:
    """A known failure line with its 1-based line number and what to do about it."""

    kind: FailureKind
    line: str
    lineno: int
    hint: str


@dataclass(frozen=True)
class NcclLog:
    """Facts from the last NCCL init in the log (later lines win) and every failure found."""

    version: str | None
    network: str | None  # Socket, IB, or a plugin's name (FastSocket, OFI...)
    devices: tuple[NetDevice, ...]
    oob: str | None  # bootstrap interface and address, e.g. "eth0:10.2.0.4"
    socket_ifname: str | None  # NCCL_SOCKET_IFNAME as NCCL saw it, when it says
    channels: int | None
    nranks: int | None
    nnodes: int | None
    init_complete: int  # "Init COMPLETE" lines (one per rank in this log)
    gpu_direct_rdma: bool  # a channel went "via NET/IB/.../GDRDMA"
    failures: tuple[Finding, ...]
    nccl_lines: int


def parse(text: str) -> NcclLog:
    """Parse a log tail written with ``NCCL_DEBUG=INFO`` (or WARN).

    Raises :class:`ParseError` only for a ``NET/<x> : Using`` line whose device list is
    not in a format we know (the devices would otherwise be silently wrong).
    """
    facts: dict[str, str] = {}
    nets = _Nets()
    failures: list[Finding] = []
    init_complete = nccl_lines = 0
    gdr = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        old = _OLD_LINE.search(line)
        if "NCCL" not in line and old is None:
            continue
        nccl_lines += 1
        nets.read(line, raw, lineno)
        if match := _BOOTSTRAP.search(line):
            nets.oob = f"{match['name']}:{match['addr']}"
        for key, pattern in (("version", _VERSION), ("channels", _RING), ("nranks", _NRANKS),
                             ("socket_ifname", _IFNAME_ENV)):
            if match := pattern.search(line):
                facts[key] = match.group(1)
                if key == "nranks" and match["nodes"]:
                    facts["nnodes"] = match["nodes"]
        init_complete += "Init COMPLETE" in line
        gdr = gdr or "/GDRDMA" in line
        finding = _finding(line, lineno, warn="NCCL WARN" in line or (old is not None and old["level"] == "WARN"))
        if finding is not None:
            failures.append(finding)
    network = nets.said or nets.last
    return NcclLog(
        version=facts.get("version"),
        network=network,
        devices=nets.listed.get(network or "", nets.listed.get(nets.last or "", ())),
        oob=nets.oob,
        socket_ifname=facts.get("socket_ifname"),
        channels=int(facts["channels"]) if "channels" in facts else None,
        nranks=int(facts["nranks"]) if "nranks" in facts else None,
        nnodes=int(facts["nnodes"]) if "nnodes" in facts else None,
        init_complete=init_complete,
        gpu_direct_rdma=gdr,
        failures=tuple(failures),
        nccl_lines=nccl_lines,
    )


@dataclass
class _Nets:
    """The networks' devices as the log lists them, later listings replacing earlier ones (module text)."""

    listed: dict[str, tuple[NetDevice, ...]] = field(default_factory=dict)
    last: str | None = None  # the network that listed devices last
    said: str | None = None  # the network NCCL says it uses
    oob: str | None = None  # the bootstrap or OOB interface, "eth0:10.2.0.4"
    found: list[NetDevice] = field(default_factory=list)  # the last run of "NET : Using interface" lines
    in_run: bool = False
    ib: list[NetDevice] = field(default_factory=list)  # the old one-line-per-port IB listing

    def read(self, line: str, raw: str, lineno: int) -> None:
        in_run, self.in_run = self.in_run, False
        if match := _NET_USING.search(line):
            devices, oob = _devices(match["list"], raw, lineno)
            if devices:  # none: NCCL found no device for it ("NET/IB : Using [RO]; OOB ...") and goes on without it
                self._list(match["net"], devices)
            self.oob = oob or self.oob
        elif match := _OLD_IFACE.search(line):
            self.found = self.found if in_run else []
            self.found.append(NetDevice(len(self.found), match["name"], address=match["addr"]))
            self.in_run = True
        elif match := _OLD_FOUND.search(line):
            count = int(match["n"])
            found = self.found[-count:] if 0 < count <= len(self.found) else self.found
            self._list(match["net"], tuple(replace(d, index=i) for i, d in enumerate(found)))
        elif match := _OLD_SIDEBAND.search(line):
            address = next((d.address for d in reversed(self.found) if d.name == match["name"] and d.address), None)
            self.oob = f"{match['name']}:{address}" if address else match["name"]
        elif match := _OLD_IB_DEV.search(line):
            self.ib = [] if match["i"] == "0" else self.ib
            self.ib.append(NetDevice(int(match["i"]), match["name"], port=int(match["port"]), link=match["kind"]))
            self._list("IB", tuple(self.ib))
        elif match := _USING_NETWORK.search(line):
            self.said = match.group(1)

    def _list(self, net: str, devices: tuple[NetDevice, ...]) -> None:
        self.listed[net], self.last = devices, net


def _devices(listing: str, raw: str, lineno: int) -> tuple[tuple[NetDevice, ...], str | None]:
    """Devices and OOB interface from ``[0]mlx5_0:1/IB [1]... [RO]; OOB eth0:10.2.0.4<0>``; no devices where
    NCCL found none but still names the OOB interface."""
    listing, has_oob, oob = listing.partition("; OOB ")
    devices = []
    for token in listing.split():
        if token == "[RO]":  # relaxed ordering enabled
            continue
        if match := _IB_DEV.match(token):
            devices.append(NetDevice(int(match["i"]), match["name"], port=int(match["port"]), link=match["kind"]))
        elif match := _SOCKET_DEV.match(token):
            devices.append(NetDevice(int(match["i"]), match["name"], address=match["addr"]))
        else:
            raise ParseError(TOOL, f"unknown device entry {token!r} in a NET/... : Using line", line=raw, lineno=lineno)
    if not devices and not has_oob:
        raise ParseError(TOOL, "a NET/... : Using line with no devices", line=raw, lineno=lineno)
    oob_match = re.match(r"(?P<name>[\w.@-]+):(?P<addr>[^<\s]+)", oob.strip())
    return tuple(devices), f"{oob_match['name']}:{oob_match['addr']}" if oob_match else None


def _finding(line: str, lineno: int, warn: bool) -> Finding | None:
    for kind, pattern, hint in _RULES:
        if pattern.search(line):
            return Finding(kind, line, lineno, hint)
    if warn and not _BENIGN_WARN.search(line):
        return Finding(FailureKind.OTHER_WARN, line, lineno, "an NCCL warning this parser does not know; read it")
    return None
