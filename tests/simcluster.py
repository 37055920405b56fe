"""A simulated cluster on one Linux machine: network namespaces, two shaped networks, a real sshd per node.

Layout of a cluster of N nodes (all names carry a random per-cluster prefix ``crs<4 hex>``, so leftover or
parallel clusters never clash and teardown only ever touches what this object created)::

    root namespace                               node i (namespace crs<hex>-n<i>)
    bridge crs<hex>bm  198.18.S.1/24  <-- veth -->  eth0  198.18.S.(10+i)/24   management, tbf 200mbit
    bridge crs<hex>bd  198.19.S.1/24  <-- veth -->  eth1  198.19.S.(10+i)/24   data, tbf 2gbit

``S`` is the cluster's slot, the lowest third octet not used by another cluster on this machine (chosen
under a file lock), so several clusters can be up at once; a cluster holds up to 240 nodes (host numbers
10 to 249). ``mgmt_subnet`` and ``data_subnet`` give the two /24s of a started cluster. A
``blackhole 198.18.0.0/15`` route in the root namespace (shared by all clusters, removed with the last one)
keeps any other benchmark-range packet from leaving the machine; the bridges' /24 routes are more specific
and win.

All namespaces' neighbour (ARP) entries count against one machine-wide limit (``gc_thresh3``, 1024 by
default), where every real node has a table of its own: past it packets to new peers are dropped ("neighbor
table overflow" in dmesg), which at 64 or more nodes looks like a firewalled port. While any cluster is up the
limits are raised (see ``_NEIGH_LIMITS``); the last one to stop puts the values it found back.

Shaping is a tbf qdisc on each node NIC's egress, so node-to-node and node-to-root traffic is shaped at the
sender; root-to-node traffic is not shaped.

Each node runs ``/usr/sbin/sshd -D`` inside ``ip netns exec NS unshare --uts --mount``: its own hostname
(``node<i>``) and bind mounts over /etc/hosts (every node's names; localhost only with ``names_resolve=False``),
/etc/resolv.conf (a name server that refuses at once), /root/.bashrc (empty) and the login
records (/var/log/wtmp, ...), everything else shared with the host, so ``sys.executable`` and the installed
packages work on every node. Commands run through :meth:`SimCluster.ns_run` see the same view.

There is no PID namespace: node processes are visible from the root namespace, which is how
:meth:`SimCluster.processes` and the teardown find them (by network namespace, never by name).

Teardown finds everything by the cluster's prefix, so it also works after a partial start or an interrupted
stop. Each live cluster leaves an owner record in /run/clusterrun-simcluster/; when the owning process died
without stopping it (SIGKILL, a CI timeout), the next :meth:`SimCluster.start` or
:func:`sweep_stale_clusters` tears it down. :meth:`SimCluster.reset` puts a shared cluster back as started
(faults undone, sshds running, node processes killed) between tests.

Not thread-safe: drive one cluster from one thread.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import os
import re
import secrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from loadscale import scaled

__all__ = ["NodeCommandError", "SimCluster", "SimNode", "missing_requirements", "sweep_stale_clusters"]

# tool -> Debian package that provides it (for the error messages)
_TOOLS = {
    "ip": "iproute2",
    "tc": "iproute2",
    "iptables": "iptables",
    "iptables-restore": "iptables",
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "mount": "mount",
}
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

BENCH_RANGE = "198.18.0.0/15"
# Marks the blackhole route as ours (``proto``), so we never delete one somebody else added.
_ROUTE_PROTO = "198"
_LOCK_FILE = Path("/run/lock/clusterrun-simcluster.lock")
# One owner record per live cluster (owner PID and its start time, work dir), so that the next cluster
# can tear down the leftovers of one whose test process was killed before stop() ran.
_STATE_DIR = Path("/run/clusterrun-simcluster")
#: Every namespace's neighbour (ARP) entries count against one machine-wide limit (gc_thresh3, 1024 by default;
#: past it new entries fail with "neighbor table overflow" and packets to new peers are dropped), where each
#: real node has a table of its own. All pairs of 240 nodes on two networks need about 2 x 240 x 240 entries.
#: Raised while any cluster is up; the values found are kept in _NEIGH_SAVED and put back by the last one.
_NEIGH_LIMITS = {"net.ipv4.neigh.default.gc_thresh2": 65536, "net.ipv4.neigh.default.gc_thresh3": 131072}
_NEIGH_SAVED = Path("/run/clusterrun-simcluster.neighbour-limits")
MAX_NODES = 240
_FIRST_HOST = 10
# Files bind-mounted inside each node when they exist on the host: a heavy ~/.bashrc slows every ssh
# command (Debian's bash sources it for non-interactive ssh commands), and sshd would otherwise write
# the host's login records for pty sessions.
_NODE_PRIVATE_FILES = ("/root/.bashrc", "/var/log/wtmp", "/var/log/btmp", "/var/log/lastlog")

# Run by ``python -I -S`` inside a node: one TCP connect, one word out (see SimCluster.probe_tcp).
_TCP_PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("open")
except ConnectionRefusedError:
    print("refused")
except TimeoutError:
    print("timeout")
except OSError:
    print("unreachable")
"""
TcpProbe = Literal["open", "refused", "timeout", "unreachable"]

_NIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)([kmgt]?)(bit|bps)$")


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":" + _SEARCH_PATH)


def missing_requirements() -> list[str]:
    """Say what this machine lacks to run a simulated cluster; an empty list means it can.

    Returns one sentence per problem (not root, a missing tool with the package to install, ...).
    """
    missing = []
    if os.geteuid() != 0:
        missing.append("not running as root (network namespaces, iptables and sshd need root)")
    if not Path("/proc/self/ns/net").exists():
        missing.append("kernel without network namespaces (/proc/self/ns/net is absent)")
    for tool, package in _TOOLS.items():
        if _which(tool) is None:
            missing.append(f"no `{tool}` (Debian package {package}; run .ci/install-cluster-deps)")
    return missing


def _require_tools() -> dict[str, str]:
    paths = {tool: _which(tool) for tool in _TOOLS}
    absent = [f"`{tool}` (package {_TOOLS[tool]})" for tool, path in paths.items() if path is None]
    if absent:
        raise RuntimeError(
            "simulated cluster: missing " + ", ".join(absent) + "; install them with .ci/install-cluster-deps"
        )
    return {tool: path for tool, path in paths.items() if path is not None}


def _rate_bytes_per_s(rate: str) -> float:
    """Parse a tc rate such as ``200mbit`` or ``1gbps`` (SI prefixes) into bytes per second."""
    match = _RATE.match(rate.strip().lower())
    if match is None:
        raise ValueError(f"rate {rate!r} is not a tc rate like '200mbit', '2gbit' or '100mbps'")
    value = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[match.group(2)]
    return value / 8 if match.group(3) == "bit" else value


def _tbf_args(rate: str) -> list[str]:
    # The bucket holds 4 ms at full rate but never less than one 64 KiB GSO segment plus headers:
    # smaller buckets make tbf split or drop the large segments veth hands it and undershoot the rate.
    burst = max(int(_rate_bytes_per_s(rate) * 0.004), 70_000)
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]


@dataclass(frozen=True)
class SimNode:
    """One simulated host."""

    index: int
    name: str  # "node0", "node1", ... (also the hostname inside the node)
    netns: str  # network namespace name
    mgmt_ip: str
    data_ip: str
    mgmt_nic: str  # NIC name inside the node, "eth0"
    data_nic: str  # "eth1" or the name given to SimCluster


class NodeCommandError(subprocess.CalledProcessError):
    """A command run inside a node exited non-zero; the message names the node and shows stderr."""

    def __init__(self, node: str, proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(proc.returncode, proc.args, proc.stdout, proc.stderr)
        self.node = node

    def __str__(self) -> str:
        tail = "\n".join((self.stderr or "").strip().splitlines()[-10:])
        return f"{self.node}: {shlex.join(map(str, self.cmd))} exited {self.returncode}\n{tail}"


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Serialise slot choice and the shared blackhole route between clusters of all processes."""
    _LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(_LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class SimCluster:
    """N simulated nodes with real sshds; see the module docstring for the layout.

    Use as a context manager or call :meth:`start` and :meth:`stop` (idempotent, also registered with
    ``atexit``). ``nodes``, ``mgmt_subnet`` and ``data_subnet`` are filled in by :meth:`start`.
    """

    def __init__(
        self,
        n_nodes: int,
        *,
        mgmt_rate: str = "200mbit",
        data_rate: str = "2gbit",
        data_nic_names: list[str] | None = None,
        mtu: int = 1500,
        names_resolve: bool = True,
    ) -> None:
        if not 1 <= n_nodes <= MAX_NODES:
            raise ValueError(f"n_nodes must be between 1 and {MAX_NODES}, got {n_nodes}")
        data_nics = list(data_nic_names) if data_nic_names is not None else ["eth1"] * n_nodes
        if len(data_nics) != n_nodes:
            raise ValueError(f"data_nic_names has {len(data_nics)} names for {n_nodes} nodes")
        for nic in data_nics:
            if not _NIC_NAME.match(nic) or nic in ("eth0", "lo"):
                raise ValueError(f"data NIC name {nic!r} is not a valid name (1-15 chars, not eth0 or lo)")
        if not 68 <= mtu <= 65535:
            raise ValueError(f"mtu must be between 68 and 65535, got {mtu}")
        _tbf_args(mgmt_rate), _tbf_args(data_rate)  # validate early

        self.n_nodes = n_nodes
        self.mgmt_rate = mgmt_rate
        self.data_rate = data_rate
        self.mtu = mtu
        # False: each node's /etc/hosts names localhost only, so no node name (its own included) resolves
        # anywhere in the cluster, as on machines without DNS; ssh still reaches nodes through ssh_config.
        self.names_resolve = names_resolve
        self._data_nics = data_nics
        self.prefix = "crs" + secrets.token_hex(2)
        self.nodes: list[SimNode] = []
        self.mgmt_subnet = ""
        self.data_subnet = ""
        self.workdir = Path()
        self.ssh_config = Path()
        self.identity_file = Path()
        self.known_hosts = Path()
        self.host_key_line = ""
        self._tools: dict[str, str] = {}
        self._slot = -1
        self._ns_inodes: dict[int, int] = {}  # netns inode -> node index
        self._sshd: dict[int, subprocess.Popen[bytes]] = {}
        self._faults: dict[tuple[int, str], list[str]] = {}  # (node, fault key) -> iptables rules
        self._altered: set[tuple[int, str]] = set()  # (node, "mgmt"/"data") NICs reshaped or with another MTU
        self._started = False
        self._stopped = False

    # ----------------------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def _bridge_mgmt(self) -> str:
        return f"{self.prefix}bm"

    @property
    def _bridge_data(self) -> str:
        return f"{self.prefix}bd"

    def start(self) -> SimCluster:
        """Build every namespace, link, shaper and sshd; return once every sshd accepts on both networks.

        Raises RuntimeError (naming the missing tool, or the node whose sshd did not come up) and
        cleans up whatever it had built before raising.
        """
        if self._started:
            raise RuntimeError("SimCluster.start() called twice; create a new SimCluster")
        self._tools = _require_tools()
        if os.geteuid() != 0:
            raise RuntimeError("simulated cluster: must run as root")
        self._started = True
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise
        return self

    def _start(self) -> None:
        with _machine_lock():
            _sweep_stale_locked(self._tools)
            for _ in range(100):
                if not any(name.startswith(self.prefix) for name in _netns_names()):
                    break
                self.prefix = "crs" + secrets.token_hex(2)  # a live cluster has this prefix: draw again
            else:
                raise RuntimeError("simulated cluster: no free name prefix (stale namespaces in /run/netns?)")
            self.workdir = Path(tempfile.mkdtemp(prefix=f"simcluster-{self.prefix}-"))
            _STATE_DIR.mkdir(mode=0o755, exist_ok=True)
            _raise_neighbour_limits()
            (_STATE_DIR / self.prefix).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n{self.workdir}\n")
        # sshd refuses to start without its privilege separation directory (normally made by systemd).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self._make_keys()
        with _machine_lock():
            self._slot = self._free_slot()
            self.mgmt_subnet = f"198.18.{self._slot}.0/24"
            self.data_subnet = f"198.19.{self._slot}.0/24"
            self.nodes = [
                SimNode(
                    index=i,
                    name=f"node{i}",
                    netns=f"{self.prefix}-n{i}",
                    mgmt_ip=f"198.18.{self._slot}.{_FIRST_HOST + i}",
                    data_ip=f"198.19.{self._slot}.{_FIRST_HOST + i}",
                    mgmt_nic="eth0",
                    data_nic=self._data_nics[i],
                )
                for i in range(self.n_nodes)
            ]
            self._build_root_side()
        self._write_files()
        self._add_root_rules()
        workers = min(8, self.n_nodes)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="simcluster-up") as pool:
            # list() re-raises the first failure
            list(pool.map(self._build_node, self.nodes))
        self._wait_sshd(self.nodes, timeout=10 + 0.2 * self.n_nodes)

    def _make_keys(self) -> None:
        keygen = self._tools["ssh-keygen"]
        procs = [
            subprocess.Popen(
                [keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"simcluster-{self.prefix}-{name}", "-f", path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for name, path in (("host", str(self.workdir / "host_key")), ("client", str(self.workdir / "id")))
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=30)
            if proc.returncode != 0:
                raise RuntimeError(f"ssh-keygen failed: {err.decode(errors='replace').strip()}")
        self.identity_file = self.workdir / "id"
        key_type, key_data = (self.workdir / "host_key.pub").read_text().split()[:2]
        self.host_key_line = f"{key_type} {key_data}"

    def _free_slot(self) -> int:
        out = self._ip(["-4", "-o", "addr", "show"]).stdout
        used = set()
        for address in re.findall(r"inet (198\.1[89]\.\d+\.\d+)/", out):
            used.add(int(address.split(".")[2]))
        for slot in range(256):
            if slot not in used:
                return slot
        raise RuntimeError("simulated cluster: all 256 slots of 198.18.0.0/15 are taken by other clusters")

    def _build_root_side(self) -> None:
        mtu = str(self.mtu)
        lines = []
        for node in self.nodes:
            lines.append(f"netns add {node.netns}")
        for bridge, cidr in ((self._bridge_mgmt, self.mgmt_subnet), (self._bridge_data, self.data_subnet)):
            host = str(next(ipaddress.ip_network(cidr).hosts()))
            prefixlen = ipaddress.ip_network(cidr).prefixlen
            lines += [
                f"link add {bridge} mtu {mtu} type bridge",
                f"addr add {host}/{prefixlen} dev {bridge}",
                f"link set {bridge} up",
            ]
        for node in self.nodes:
            for kind, nic, bridge in (
                ("m", node.mgmt_nic, self._bridge_mgmt),
                ("d", node.data_nic, self._bridge_data),
            ):
                veth = f"{self.prefix}{kind}{node.index}"
                lines += [
                    f"link add {veth} mtu {mtu} type veth peer name {nic} mtu {mtu} netns {node.netns}",
                    f"link set {veth} master {bridge} up",
                ]
        if self._ip(["route", "show", "exact", BENCH_RANGE], check=True).stdout.strip() == "":
            lines.append(f"route add blackhole {BENCH_RANGE} proto {_ROUTE_PROTO}")
        self._ip(["-batch", "-"], input="\n".join(lines) + "\n")
        for node in self.nodes:
            self._ns_inodes[os.stat(f"/run/netns/{node.netns}").st_ino] = node.index

    def _add_root_rules(self) -> None:
        # With bridge-nf-call-iptables=1 bridged frames traverse the root namespace's FORWARD chain: a
        # DROP policy there would cut node-to-node traffic. INPUT lets nodes reach the root's bridge
        # addresses whatever the host's policy. The comment marks the rules as this cluster's.
        tag = f"-m comment --comment {_rule_tag(self.prefix)} -j ACCEPT"
        rules = []
        for bridge in (self._bridge_mgmt, self._bridge_data):
            rules += [f"-I INPUT -i {bridge} {tag}", f"-I FORWARD -i {bridge} -o {bridge} {tag}"]
        self._iptables_restore(None, rules)

    def _write_files(self) -> None:
        wd = self.workdir
        self.ssh_config = wd / "ssh_config"
        self.known_hosts = wd / "known_hosts"
        (wd / "authorized_keys").write_text((wd / "id.pub").read_text())
        self.known_hosts.write_text(
            "".join(f"{n.name},{n.mgmt_ip},{n.name}-data,{n.data_ip} {self.host_key_line}\n" for n in self.nodes)
        )
        blocks = []
        for node in self.nodes:
            for alias, address in ((node.name, node.mgmt_ip), (f"{node.name}-data", node.data_ip)):
                blocks.append(
                    f"Host {alias}\n"
                    f"    HostName {address}\n"
                    "    User root\n"
                    "    Port 22\n"
                    f"    IdentityFile {self.identity_file}\n"
                    "    IdentitiesOnly yes\n"
                    f"    UserKnownHostsFile {self.known_hosts}\n"
                    "    StrictHostKeyChecking yes\n"
                    "    ConnectTimeout 5\n"
                )
        blocks.append(
            "Host *\n"
            # never prompt: a test must fail, not hang on a password or a host-key question
            "    BatchMode yes\n"
            "    GlobalKnownHostsFile /dev/null\n"
            # keep ssh from appending keys to the harness known_hosts
            "    UpdateHostKeys no\n"
            # 128 ms per connection instead of 195 ms with the default sntrup761x25519 exchange
            "    KexAlgorithms curve25519-sha256\n"
            # a partitioned node ends a session within 15 s instead of hanging on TCP retries
            "    ServerAliveInterval 5\n"
            "    ServerAliveCountMax 3\n"
            "    SendEnv LANG LC_*\n"
            "    LogLevel ERROR\n"
        )
        self.ssh_config.write_text("\n".join(blocks))
        hosts = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        for node in self.nodes if self.names_resolve else ():
            hosts += [f"{node.mgmt_ip} {node.name}", f"{node.data_ip} {node.name}-data"]
        # the node has no name server: fail lookups at once instead of hanging on the host's one
        resolv = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
        for name in ("bashrc", "wtmp", "btmp", "lastlog"):
            (wd / name).touch()
        for node in self.nodes:
            node_dir = wd / node.name
            node_dir.mkdir()
            (node_dir / "hosts").write_text("\n".join(hosts) + "\n")
            (node_dir / "resolv.conf").write_text(resolv)
            (node_dir / "sshd_config").write_text(self._sshd_config(node))

    def _sshd_config(self, node: SimNode) -> str:
        lines = [
            f"ListenAddress {node.mgmt_ip}:22",
            f"ListenAddress {node.data_ip}:22",
            f"HostKey {self.workdir / 'host_key'}",
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
            "PidFile none",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            # the keys live in a temp dir whose parents' modes we do not control
            "StrictModes no",
            "UseDNS no",
            # defaults (10:30:100, 10) drop concurrent connections at random under fan-out tests
            "MaxStartups 100",
            "MaxSessions 100",
            "AcceptEnv LANG LC_*",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            "LogLevel INFO",
        ]
        return "\n".join(lines) + "\n"

    def _enter_argv(self, node: SimNode, argv: Sequence[str]) -> list[str]:
        """argv that runs ``argv`` inside the node: its network, hostname and private files."""
        node_dir = self.workdir / node.name
        binds = [(node_dir / "hosts", "/etc/hosts"), (node_dir / "resolv.conf", "/etc/resolv.conf")]
        for target in _NODE_PRIVATE_FILES:
            if os.path.exists(target):
                binds.append((self.workdir / Path(target).name.lstrip("."), target))
        mount = shlex.quote(self._tools["mount"])
        steps = [f"echo {shlex.quote(node.name)} > /proc/sys/kernel/hostname"]
        steps += [f"{mount} --bind {shlex.quote(str(src))} {shlex.quote(dst)}" for src, dst in binds]
        script = " && ".join(steps) + ' && exec "$@"'
        return [
            self._tools["ip"], "netns", "exec", node.netns,
            self._tools["unshare"], "--uts", "--mount",
            "sh", "-c", script, node.name, *argv,
        ]  # fmt: skip

    def _build_node(self, node: SimNode) -> None:
        batch = ["link set lo up"]
        for nic, ip, cidr in (
            (node.mgmt_nic, node.mgmt_ip, self.mgmt_subnet),
            (node.data_nic, node.data_ip, self.data_subnet),
        ):
            batch += [f"addr add {ip}/{cidr.split('/')[1]} dev {nic}", f"link set {nic} up"]
        self._ip(["-n", node.netns, "-batch", "-"], input="\n".join(batch) + "\n")
        tc_batch = [
            f"qdisc replace dev {nic} root {' '.join(_tbf_args(rate))}"
            for nic, rate in ((node.mgmt_nic, self.mgmt_rate), (node.data_nic, self.data_rate))
        ]
        self._run([self._tools["tc"], "-n", node.netns, "-batch", "-"], input="\n".join(tc_batch) + "\n")
        self._spawn_sshd(node)

    def _spawn_sshd(self, node: SimNode) -> None:
        node_dir = self.workdir / node.name
        argv = [self._tools["sshd"], "-D", "-f", str(node_dir / "sshd_config"), "-E", str(node_dir / "sshd.log")]
        with open(node_dir / "node.log", "ab") as log:
            # Own session: a Ctrl-C aimed at the test run must not kill the nodes under the tests' feet;
            # stop() ends them. The chain ip -> unshare -> sh execs into sshd, so this PID is the listener.
            self._sshd[node.index] = subprocess.Popen(
                self._enter_argv(node, argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def _wait_sshd(self, nodes: Sequence[SimNode], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = [(node, ip) for node in nodes for ip in (node.mgmt_ip, node.data_ip)]
        for _ in range(int(timeout / 0.01) + 10):
            still = []
            for node, ip in pending:
                proc = self._sshd[node.index]
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{node.name}: sshd exited with {proc.returncode} during start\n{self._log_tail(node)}"
                    )
                if not _accepts(ip, 22, 0.2):
                    still.append((node, ip))
            pending = still
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.01)  # poll step of a deadline-bounded wait
        if pending:
            names = ", ".join(sorted({f"{node.name} ({ip})" for node, ip in pending}))
            raise RuntimeError(f"sshd not accepting after {timeout:.0f}s on {names}\n{self._log_tail(pending[0][0])}")

    def _log_tail(self, node: SimNode) -> str:
        texts = []
        for name in ("node.log", "sshd.log"):
            path = self.workdir / node.name / name
            if path.exists():
                texts += path.read_text(errors="replace").splitlines()[-10:]
        return "\n".join(texts)

    def stop(self) -> None:
        """Tear everything down: node processes (by PID), namespaces, links, iptables rules, the route,
        the temp dir. Idempotent and safe after a partial start; Ctrl-C waits until it is done.

        Raises RuntimeError listing what could not be removed, after trying everything.
        """
        if self._stopped or not self._started:
            return
        with _sigint_deferred():
            for proc in self._sshd.values():
                _end_child(proc)
            with _machine_lock():
                errors = _teardown(self._tools, self.prefix, set(self._ns_inodes))
                errors += _drop_blackhole_if_unused(self._tools)
                (_STATE_DIR / self.prefix).unlink(missing_ok=True)
                errors += _restore_neighbour_limits_if_unused()
            if self.workdir != Path() and self.workdir.exists():
                shutil.rmtree(self.workdir, ignore_errors=True)
            # only now: a stop() cut short (an exception) is retried at exit
            self._stopped = True
            atexit.unregister(self.stop)
        if errors:
            raise RuntimeError(f"simulated cluster {self.prefix}: teardown incomplete: " + "; ".join(errors))

    def leftovers(self) -> list[str]:
        """Namespaces, links and root iptables rules carrying this cluster's prefix (empty once stopped)."""
        return _leftovers(self._tools or _require_tools(), self.prefix)

    # ------------------------------------------------------------------------------------ processes

    def _scan(self) -> list[tuple[int, int, str]]:
        """(pid, node index, cmdline) of every live process in this cluster's namespaces."""
        return [(pid, self._ns_inodes[inode], cmd) for pid, inode, cmd in _scan_netns(set(self._ns_inodes))]

    def processes(self, node: SimNode | str | int, *, include_sshd_listener: bool = False) -> list[tuple[int, str]]:
        """(pid, cmdline) of every process in the node's network namespace, sorted by PID.

        The harness's own sshd listener is left out unless ``include_sshd_listener``; ssh sessions
        (``sshd: root@notty``) and everything they started are included.
        """
        target = self.node(node)
        listener = self._listener_pid(target)
        return sorted(
            (pid, cmd)
            for pid, index, cmd in self._scan()
            if index == target.index and (include_sshd_listener or pid != listener)
        )

    def job_processes(self, marker: str) -> dict[str, list[tuple[int, str]]]:
        """Processes whose cmdline or environment contains ``marker``, by node name.

        Only nodes with at least one such process appear: an empty dict means none is left anywhere.
        """
        needle = marker.encode()
        found: dict[str, list[tuple[int, str]]] = {}
        for pid, index, cmd in self._scan():
            hit = needle in cmd.encode()
            if not hit:
                try:
                    hit = needle in Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    continue
            if hit:
                found.setdefault(self.nodes[index].name, []).append((pid, cmd))
        return found

    def wait_no_processes(self, marker: str, timeout: float) -> dict[str, list[tuple[int, str]]]:
        """Poll :meth:`job_processes` until nothing carries ``marker`` or ``timeout`` passes (scaled with the
        machine's load, tests/loadscale.py: a busy machine reaps more slowly).

        Returns what is left at the end (an empty dict when clean).
        """
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        left = self.job_processes(marker)
        for _ in range(int(timeout / 0.05) + 2):
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.05)  # poll step of a deadline-bounded wait
            left = self.job_processes(marker)
        return left

    # ------------------------------------------------------------------------------------ commands

    def node(self, name_or_index: SimNode | str | int) -> SimNode:
        """Look a node up by index, name ("node2") or SimNode; raise KeyError if it is not ours."""
        if isinstance(name_or_index, SimNode):
            if name_or_index in self.nodes:
                return name_or_index
        elif isinstance(name_or_index, int):
            if 0 <= name_or_index < len(self.nodes):
                return self.nodes[name_or_index]
        else:
            for node in self.nodes:
                if node.name == name_or_index:
                    return node
        raise KeyError(f"no node {name_or_index!r} in cluster {self.prefix} ({len(self.nodes)} nodes)")

    def ns_run(
        self, node: SimNode | str | int, argv: list[str], *, timeout: float = 10, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the node (its namespace, hostname and /etc files), not through ssh.

        Raises NodeCommandError (a CalledProcessError) on a non-zero exit when ``check``, and
        subprocess.TimeoutExpired after ``timeout`` seconds (the command is killed).
        """
        target = self.node(node)
        proc = subprocess.run(
            self._enter_argv(target, argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise NodeCommandError(target.name, proc)
        return proc

    def ns_popen(self, node: SimNode | str | int, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the node in the background, like :meth:`ns_run`; the caller waits on it.

        Whatever is still running at :meth:`stop` is killed with the node.
        """
        return subprocess.Popen(self._enter_argv(self.node(node), argv), **popen_kwargs)

    def ssh_argv(self, node: SimNode | str | int, command: str) -> list[str]:
        """The OpenSSH client command line that runs ``command`` on the node with the harness config.

        ``node`` may also be a data alias such as ``"node1-data"``, to connect over the data network.
        """
        if isinstance(node, str) and node.endswith("-data"):
            host = f"{self.node(node.removesuffix('-data')).name}-data"
        else:
            host = self.node(node).name
        return [self._tools["ssh"], "-F", str(self.ssh_config), host, command]

    def ssh_run(
        self, node: SimNode | str | int, command: str, *, timeout: float = 10
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on the node over ssh (see :meth:`ssh_argv`); never raises on exit status.

        Raises subprocess.TimeoutExpired after ``timeout`` seconds (the local ssh client is killed;
        what it started on the node may live on).
        """
        return subprocess.run(
            self.ssh_argv(node, command), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    def probe_tcp(self, node: SimNode | str | int, address: str, port: int = 22, *, timeout: float = 1.0) -> TcpProbe:
        """Try one TCP connect from inside ``node`` to ``address:port`` and say what happened.

        Returns "open" (connected), "refused" (RST: nothing listens), "timeout" (no answer within
        ``timeout`` seconds: dropped packets) or "unreachable" (no route, host unreachable).
        Raises NodeCommandError if the probe itself could not run.
        """
        argv = [sys.executable, "-I", "-S", "-c", _TCP_PROBE, address, str(int(port)), str(timeout)]
        word = self.ns_run(node, argv, timeout=timeout + 10).stdout.strip()
        if word not in ("open", "refused", "timeout", "unreachable"):
            raise RuntimeError(f"TCP probe from {self.node(node).name} printed {word!r}")
        return cast(TcpProbe, word)

    # ------------------------------------------------------------------------------------ faults

    def _nic(self, node: SimNode, which: str) -> str:
        if which == "mgmt":
            return node.mgmt_nic
        if which == "data":
            return node.data_nic
        raise ValueError(f"which must be 'mgmt' or 'data', got {which!r}")

    def _add_fault(self, node: SimNode | str | int, key: str, rules: list[str]) -> None:
        target = self.node(node)
        if (target.index, key) in self._faults:
            return
        self._iptables_restore(target, [f"-I {rule}" for rule in rules])
        self._faults[(target.index, key)] = rules

    def _remove_fault(self, node: SimNode | str | int, key: str) -> None:
        target = self.node(node)
        rules = self._faults.pop((target.index, key), None)
        if rules:
            self._iptables_restore(target, [f"-D {rule}" for rule in rules])

    def drop_nic(self, node: SimNode | str | int, which: str = "data") -> None:
        """Drop every packet in and out of one NIC of the node; the link stays UP (a dead switch port):
        TCP connects hang, they are not refused."""
        nic = self._nic(self.node(node), which)
        self._add_fault(node, f"nic-{which}", [f"INPUT -i {nic} -j DROP", f"OUTPUT -o {nic} -j DROP"])

    def restore_nic(self, node: SimNode | str | int, which: str = "data") -> None:
        """Undo :meth:`drop_nic`."""
        self._nic(self.node(node), which)
        self._remove_fault(node, f"nic-{which}")

    def partition(self, node: SimNode | str | int) -> None:
        """Drop all the node's traffic except on ``lo`` (a node that fell off both networks)."""
        self._add_fault(node, "partition", ["INPUT ! -i lo -j DROP", "OUTPUT ! -o lo -j DROP"])

    def heal(self, node: SimNode | str | int) -> None:
        """Undo :meth:`partition`."""
        self._remove_fault(node, "partition")

    def block_port(self, node: SimNode | str | int, port: int) -> None:
        """Drop incoming TCP to ``port`` from other hosts (the node itself still reaches it over lo)."""
        self._add_fault(node, f"port-{int(port)}", [f"INPUT ! -i lo -p tcp --dport {int(port)} -j DROP"])

    def block_ports_except(self, node: SimNode | str | int, port: int) -> None:
        """Drop new TCP connections into the node's data NIC on every port but ``port``: a firewall that lets
        only the master port through (the rendezvous works, the collectives' own connections hang)."""
        nic = self.node(node).data_nic
        self._add_fault(node, f"ports-but-{int(port)}", [f"INPUT -i {nic} -p tcp --syn ! --dport {int(port)} -j DROP"])

    def unblock_port(self, node: SimNode | str | int, port: int) -> None:
        """Undo :meth:`block_port`."""
        self._remove_fault(node, f"port-{int(port)}")

    def stop_sshd(self, node: SimNode | str | int) -> None:
        """Kill the node's sshd listener by PID: new connections are refused, open sessions live on."""
        target = self.node(node)
        proc = self._sshd.get(target.index)
        if proc is not None:
            _end_child(proc)

    def start_sshd(self, node: SimNode | str | int) -> None:
        """Start the node's sshd again (no-op while it runs); return once it accepts on both networks."""
        target = self.node(node)
        proc = self._sshd.get(target.index)
        if proc is None or proc.poll() is not None:
            self._spawn_sshd(target)
        self._wait_sshd([target], timeout=10)

    def shape(self, node: SimNode | str | int, which: str, rate: str) -> None:
        """Replace the tbf rate on the egress of one NIC of the node (``rate`` as tc writes it)."""
        target = self.node(node)
        nic = self._nic(target, which)
        self._altered.add((target.index, which))
        self._run([self._tools["tc"], "-n", target.netns, "qdisc", "replace", "dev", nic, "root", *_tbf_args(rate)])

    def set_mtu(self, node: SimNode | str | int, which: str, mtu: int) -> None:
        """Set the MTU of one NIC inside the node only; the bridge side keeps the cluster's MTU, so a
        larger value behaves like a jumbo-frame mismatch (big frames are dropped)."""
        target = self.node(node)
        nic = self._nic(target, which)
        self._altered.add((target.index, which))
        self._ip(["-n", target.netns, "link", "set", "dev", nic, "mtu", str(int(mtu))])

    def reset(self) -> list[str]:
        """Bring the cluster back to how :meth:`start` left it, between tests sharing one cluster.

        Undoes every fault, :meth:`shape` and :meth:`set_mtu`, starts stopped sshds, and kills (by PID:
        SIGTERM, then SIGKILL) every node process but the sshd listeners, ssh sessions included.
        Returns ``"node: pid cmdline"`` for each process it killed (what the last test left running).
        """
        for index, key in list(self._faults):
            self._remove_fault(index, key)
        listeners = {self._listener_pid(node) for node in self.nodes}
        leftover = [(pid, index, cmd) for pid, index, cmd in self._scan() if pid not in listeners]
        inodes = set(self._ns_inodes)
        for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 2.0)):
            pids = [pid for pid, _, _ in self._scan() if pid not in listeners]
            if not pids:
                break
            _signal_and_wait(pids, sig, grace, still_ours=lambda pid: _in_netns(pid, inodes))
        for index, which in sorted(self._altered):
            node = self.nodes[index]
            nic = self._nic(node, which)
            rate = self.mgmt_rate if which == "mgmt" else self.data_rate
            self._run([self._tools["tc"], "-n", node.netns, "qdisc", "replace", "dev", nic, "root", *_tbf_args(rate)])
            self._ip(["-n", node.netns, "link", "set", "dev", nic, "mtu", str(self.mtu)])
        self._altered.clear()
        for node in self.nodes:
            if self._listener_pid(node) is None:
                self.start_sshd(node)
        return [f"{self.nodes[index].name}: {pid} {cmd}" for pid, index, cmd in leftover]

    # ------------------------------------------------------------------------------------ plumbing

    def _listener_pid(self, node: SimNode) -> int | None:
        proc = self._sshd.get(node.index)
        return proc.pid if proc is not None and proc.poll() is None else None

    def _run(
        self, argv: list[str], *, input: str | None = None, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        return _run(argv, input=input, check=check, timeout=timeout)

    def _ip(self, args: list[str], *, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run([self._tools["ip"], *args], input=input, check=check)

    def _iptables_restore(self, node: SimNode | None, rules: list[str]) -> None:
        argv = [self._tools["iptables-restore"], "--noflush"]
        if node is not None:
            argv = [self._tools["nsenter"], f"--net=/run/netns/{node.netns}", *argv]
        self._run(argv, input="*filter\n" + "\n".join(rules) + "\nCOMMIT\n")


def _run(
    argv: list[str], *, input: str | None = None, check: bool = True, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _rule_tag(prefix: str) -> str:
    """The iptables comment that marks a root-namespace rule as the cluster's."""
    return f"simcluster-{prefix}"


def _netns_names() -> list[str]:
    netns_dir = Path("/run/netns")
    return sorted(os.listdir(netns_dir)) if netns_dir.is_dir() else []


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (with the PID, it names one process for good)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _scan_netns(inodes: set[int]) -> list[tuple[int, int, str]]:
    """(pid, netns inode, cmdline) of every live process whose network namespace is one of ``inodes``.

    Zombies have no namespace left and are not listed.
    """
    found: list[tuple[int, int, str]] = []
    if not inodes:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            inode = os.stat(f"/proc/{entry}/ns/net").st_ino
            if inode not in inodes:
                continue
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue  # gone, or a kernel thread
        found.append((int(entry), inode, raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")))
    return found


def _in_netns(pid: int, inodes: set[int]) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino in inodes
    except OSError:
        return False


def _root_rules(tools: dict[str, str], prefix: str) -> list[str]:
    """The cluster's rules in the root namespace, as ``iptables -S`` prints them (``-A CHAIN ...``)."""
    out = _run([tools["iptables"], "-w", "-S"], check=False).stdout
    return [rule for rule in out.splitlines() if _rule_tag(prefix) in rule.split()]


def _leftovers(tools: dict[str, str], prefix: str) -> list[str]:
    """Namespaces, root-side links and root iptables rules named for the cluster ``prefix``."""
    found = [f"netns {name}" for name in _netns_names() if name.startswith(prefix)]
    for line in _run([tools["ip"], "-o", "link", "show"], check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(prefix):
            found.append(f"link {name}")
    found += [f"iptables {rule}" for rule in _root_rules(tools, prefix)]
    return found


def _teardown(tools: dict[str, str], prefix: str, inodes: set[int]) -> list[str]:
    """Remove everything named for the cluster ``prefix``; return what could not be removed.

    Everything is found by its name, not from a record of what was built, so this also cleans up after
    a partial start, an interrupted stop or a dead owner. First the processes in the namespaces (``inodes``
    plus those still named in /run/netns): a live process would keep its namespace and veths alive.
    """
    errors = []
    namespaces = [name for name in _netns_names() if name.startswith(prefix + "-")]
    for name in namespaces:
        with contextlib.suppress(OSError):
            inodes = inodes | {os.stat(f"/run/netns/{name}").st_ino}
    for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 2.0), (signal.SIGKILL, 2.0)):
        pids = [pid for pid, _, _ in _scan_netns(inodes)]
        if not pids:
            break
        _signal_and_wait(pids, sig, grace, still_ours=lambda pid: _in_netns(pid, inodes))
    survivors = _scan_netns(inodes)
    if survivors:
        errors.append(f"processes survived SIGKILL: {[(pid, cmd) for pid, _, cmd in survivors]}")

    rules = _root_rules(tools, prefix)
    if rules:
        deletes = ["-D" + rule[2:] for rule in rules if rule.startswith("-A ")]
        try:
            _run([tools["iptables-restore"], "--noflush"], input="*filter\n" + "\n".join(deletes) + "\nCOMMIT\n")
        except RuntimeError:
            for rule in deletes:  # one by one, past any that vanished meanwhile
                _run([tools["iptables"], "-w", *shlex.split(rule)], check=False)

    # Deleting the root-side veth end deletes both ends now; leaving it to the namespace's destruction
    # would make it linger asynchronously. -force: go on past what is already gone.
    links = [item.split(" ", 1)[1] for item in _leftovers(tools, prefix) if item.startswith("link ")]
    lines = [f"link del {link}" for link in links] + [f"netns del {name}" for name in namespaces]
    if lines:
        _run([tools["ip"], "-force", "-batch", "-"], input="\n".join(lines) + "\n", check=False)
    left = _leftovers(tools, prefix)
    if left:
        errors.append("still present: " + ", ".join(left))
    return errors


def _drop_blackhole_if_unused(tools: dict[str, str]) -> list[str]:
    """Delete our blackhole route once no cluster uses the range; return errors. Call under the lock."""
    if _run([tools["ip"], "-4", "-o", "addr", "show", "to", BENCH_RANGE], check=False).stdout.strip():
        return []  # another cluster still relies on the route
    ours = _run([tools["ip"], "route", "show", "exact", BENCH_RANGE, "proto", _ROUTE_PROTO], check=False)
    if not ours.stdout.strip():
        return []
    proc = _run([tools["ip"], "route", "del", "blackhole", BENCH_RANGE, "proto", _ROUTE_PROTO], check=False)
    return [f"blackhole route: {proc.stderr.strip()}"] if proc.returncode != 0 else []


def _sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def _raise_neighbour_limits() -> None:
    """Raise the machine's neighbour-table limits (see _NEIGH_LIMITS), saving the values found first unless a
    live cluster already did. Call under the lock."""
    if _NEIGH_SAVED.exists():
        return
    found = {key: _sysctl_path(key).read_text().strip() for key in _NEIGH_LIMITS}
    _NEIGH_SAVED.write_text("".join(f"{key} {value}\n" for key, value in found.items()))
    for key, value in _NEIGH_LIMITS.items():
        if int(found[key]) < value:
            _sysctl_path(key).write_text(str(value))


def _restore_neighbour_limits_if_unused() -> list[str]:
    """Put the saved limits back once no cluster is left (no owner record); return errors. Call under the lock."""
    if not _NEIGH_SAVED.exists() or (_STATE_DIR.is_dir() and any(_STATE_DIR.iterdir())):
        return []
    errors = []
    for line in _NEIGH_SAVED.read_text().splitlines():
        key, _, value = line.partition(" ")
        try:
            _sysctl_path(key).write_text(value)
        except OSError as exc:
            errors.append(f"{key}: {exc}")
    _NEIGH_SAVED.unlink(missing_ok=True)
    return errors


def _sweep_stale_locked(tools: dict[str, str]) -> list[str]:
    """Tear down every cluster whose owner process is gone; return their prefixes. Call under the lock."""
    swept = []
    records = sorted(_STATE_DIR.iterdir()) if _STATE_DIR.is_dir() else []
    for record in records:
        try:
            owner, workdir = record.read_text().splitlines()[:2]
            pid, started = owner.split()
        except (OSError, ValueError):
            continue  # being written, or not ours: leave it
        if pid.isdigit() and _start_time(int(pid)) == started:
            continue  # owner alive: its stop() or atexit will clean up
        errors = _teardown(tools, record.name, set())
        if errors:
            warnings.warn(f"simulated cluster {record.name} (owner {pid} is gone): {'; '.join(errors)}", stacklevel=3)
            continue
        stale_dir = Path(workdir)
        if stale_dir.parent == Path(tempfile.gettempdir()) and stale_dir.name.startswith(f"simcluster-{record.name}-"):
            shutil.rmtree(stale_dir, ignore_errors=True)
        record.unlink(missing_ok=True)
        swept.append(record.name)
    return swept


def sweep_stale_clusters() -> list[str]:
    """Tear down the leftovers of clusters whose test process died before stop() (SIGKILL, a CI timeout):
    their node processes, sshds, namespaces, links, iptables rules and work dirs. Return their prefixes.

    :meth:`SimCluster.start` does this too; clusters whose owner is alive are never touched.
    """
    tools = _require_tools()
    with _machine_lock():
        swept = _sweep_stale_locked(tools)
        if swept:
            for error in _drop_blackhole_if_unused(tools) + _restore_neighbour_limits_if_unused():
                warnings.warn(error, stacklevel=2)
    return swept


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C back until the block is done (a half-done teardown leaves more behind), then raise it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
    if caught and callable(previous):
        previous(signal.SIGINT, None)


def _accepts(ip: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:
        return False


def _end_child(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM one of our children, SIGKILL it after a grace period, and reap it."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout=scaled(2))
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=scaled(2))


def _signal_and_wait(pids: list[int], sig: int, grace: float, still_ours: Callable[[int], bool]) -> None:
    """Send ``sig`` to each PID through a pidfd and wait up to ``grace`` seconds for all to exit.

    A pidfd pins the process, so after ``still_ours(pid)`` confirms it is still in one of our namespaces
    a recycled PID can no longer be hit.
    """
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # already gone
        if not still_ours(pid):
            os.close(fd)
            continue
        fds[fd] = pid
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, sig)
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + grace
        remaining = set(fds)
        for _ in range(len(fds) + 1):
            left_s = deadline - time.monotonic()
            if not remaining or left_s <= 0:
                break
            for fd, _event in poller.poll(left_s * 1000):
                remaining.discard(fd)
                poller.unregister(fd)
    finally:
        for fd in fds:
            os.close(fd)
