"""The ranks' own TCP connections, for the node's series: which NIC carries each, between which addresses, and
(where the kernel tells) how many bytes went each way.

A rank's sockets are the ``socket:[inode]`` links of ``/proc/<pid>/fd``; the kernel's table of TCP sockets
(``/proc/<pid>/net/tcp`` and ``tcp6``, read in the ranks' own network namespace) gives each inode its local and
remote address; the local address names the NIC (the interface whose route holds it: ``/proc/<pid>/net/route``,
or ``/proc/<pid>/net/if_inet6`` for IPv6). Only established connections count, and never the one to torchrun's
store (``MASTER_PORT``): its bytes are control, not collectives.

Bytes per connection come from the kernel's socket diagnostics (NETLINK_SOCK_DIAG, ``tcp_info``'s
``bytes_acked``/``bytes_received``), where the agent shares the ranks' network namespace; elsewhere only the
connections are known. Every reader is bounded to what the files hold: a rank that ends, a file that cannot be
read, leaves that part out.

Standard library only: this module travels to the nodes with the agent.
"""

from __future__ import annotations

import os
import socket
import struct

ESTABLISHED = "01"
#: Look at the ranks' fds (and the kernel's connections of both address families) this often (seconds) at least.
FULL_REFRESH = 30.0
#: Read every fd of each rank again this often; in between only fd numbers not seen before are read (a socket
#: that takes the number of a closed file is seen at the next of these).
FD_REREAD = 120.0


def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _hex_ip(text):
    """An address of /proc/net/tcp{,6} (hex, 32-bit words in host order) as text; IPv4-mapped IPv6 as IPv4."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)) if len(raw) > 4 else raw[::-1]
    if len(words) == 4:
        return socket.inet_ntop(socket.AF_INET, words)
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, words[12:])
    return socket.inet_ntop(socket.AF_INET6, words)


def tcp_table(proc, pid):
    """``{inode: (local, lport, remote, rport)}`` of the established TCP sockets in ``pid``'s namespace."""
    out = {}
    for name in ("tcp", "tcp6"):
        for line in _read(os.path.join(proc, str(pid), "net", name)).splitlines()[1:]:
            cells = line.split()
            if len(cells) < 10 or cells[3] != ESTABLISHED or not cells[9].isdigit():
                continue
            try:
                local, lport = cells[1].split(":")
                remote, rport = cells[2].split(":")
                out[int(cells[9])] = (_hex_ip(local), int(lport, 16), _hex_ip(remote), int(rport, 16))
            except ValueError:
                continue
    return out


def interfaces(proc, pid):
    """``[(network, mask, nic)]`` (IPv4, longest mask first) and ``{ipv6 address: nic}`` of ``pid``'s namespace."""
    routes = []
    for line in _read(os.path.join(proc, str(pid), "net", "route")).splitlines()[1:]:
        cells = line.split()
        if len(cells) < 8:
            continue
        try:  # each printed as the host's 32-bit word of the address: back to network order
            dest, mask = [struct.unpack("!I", struct.pack("=I", int(cells[i], 16)))[0] for i in (1, 7)]
        except (ValueError, struct.error):
            continue
        if mask:  # the default route names a gateway's NIC, not the one owning an address
            routes.append((dest, mask, cells[0]))
    routes.sort(key=lambda r: -r[1])
    six = {}
    for line in _read(os.path.join(proc, str(pid), "net", "if_inet6")).splitlines():
        cells = line.split()
        if len(cells) >= 6 and len(cells[0]) == 32:
            six[socket.inet_ntop(socket.AF_INET6, bytes.fromhex(cells[0]))] = cells[5]
    return routes, six


def nic_of(address, routes, six):
    """The NIC that owns local ``address``, or None."""
    if ":" in address:
        return six.get(address)
    if address.startswith("127."):
        return "lo"
    value = struct.unpack("!I", socket.inet_aton(address))[0]
    for dest, mask, nic in routes:
        if value & mask == dest & mask:
            return nic
    return None


def diag_sockets(sock=None, families=(socket.AF_INET, socket.AF_INET6)):
    """``{inode: (local, lport, remote, rport, bytes sent and acknowledged, bytes received, uid, family)}`` of this network
    namespace's established TCP sockets, from NETLINK_SOCK_DIAG (one request, no text to parse: /proc/net/tcp on
    a busy host costs milliseconds); None where the kernel refuses it. The bytes are None on kernels before 4.2.
    ``sock``: a netlink socket of :func:`diag_socket` to use (kept open between samples), else one for this call;
    ``families``: the address families asked for."""
    own = sock is None
    if own:
        sock = diag_socket()
        if sock is None:
            return None
    out = {}
    try:
        for family in families:
            # inet_diag_req_v2: family, TCP, ext = 1 << (INET_DIAG_INFO - 1), states = ESTABLISHED only
            req = struct.pack("=BBBxI48x", family, socket.IPPROTO_TCP, 1 << 1, 1 << 1)
            sock.send(struct.pack("=IHHII", 16 + len(req), 20, 0x301, 1, 0) + req)  # REQUEST | DUMP
            if not _diag_answers(sock, out):
                return None
    except OSError:
        return None
    finally:
        if own:
            sock.close()
    return out


def diag_socket():
    """A NETLINK_SOCK_DIAG socket (its reads bounded), or None where the kernel refuses one."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)
    except (OSError, AttributeError):
        return None
    sock.settimeout(1.0)
    return sock


def _address(family, raw):
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, raw[12:16])
    return socket.inet_ntop(socket.AF_INET6, raw[:16])


def _diag_answers(sock, out):
    while True:
        data = sock.recv(1 << 16)
        pos = 0
        while pos + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, pos)
            if kind == 3:  # NLMSG_DONE
                return True
            if kind == 2 or length < 16:  # NLMSG_ERROR
                return False
            msg = pos + 16  # struct inet_diag_msg: family, state, timer, retrans, sockid, ..., inode at 68
            family = data[msg]
            lport, rport = struct.unpack_from("!HH", data, msg + 4)
            local, remote = _address(family, data[msg + 8:msg + 24]), _address(family, data[msg + 24:msg + 40])
            uid, inode = struct.unpack_from("=II", data, msg + 64)
            sent = received = None
            attr = msg + 72
            while attr + 4 <= pos + length:
                alen, atype = struct.unpack_from("=HH", data, attr)
                if alen < 4:
                    break
                if atype == 2 and alen >= 4 + 136:  # INET_DIAG_INFO: struct tcp_info, bytes_acked at 120
                    sent, received = struct.unpack_from("=QQ", data, attr + 4 + 120)
                attr += (alen + 3) & ~3
            out[inode] = (local, lport, remote, rport, sent, received, uid, family)
            pos += (length + 3) & ~3


class RankSockets:
    """The ranks' connections, sample after sample: per NIC, per ``local>remote`` pair, how many connections and
    the bytes per second each way since the last sample (``tx``/``rx``; absent where the kernel does not say).

    Reading every rank's fd table is what costs (hundreds of fds per CUDA worker), so it is read again only when
    the kernel lists a connection not seen before (at most every ``RESCAN`` seconds), or every ``FULL_REFRESH``."""

    RESCAN = 2.0

    def __init__(self, proc="/proc", diag=True):
        self.proc = proc
        self.diag = diag
        self.fds = {}  # pid -> {fd: inode or None}
        self.refreshed = {}  # pid -> monotonic time of the last full read of its fds
        self.inodes = set()  # the ranks' sockets at the last scan
        self.scanned = None  # (monotonic time, pids) of the last scan
        self.known = set()  # every connection the kernel listed at the last scan
        self.listed = {}  # the connections as last read
        self.nets = ([], {}, None)  # routes, IPv6 addresses, when read
        self.last = {}  # inode -> (tx, rx) at the last sample
        self.same_ns = None
        self.netlink = None  # the NETLINK_SOCK_DIAG socket, open for the sampler's life
        self.families = None  # the address families of the ranks' connections at the last look
        self.uid = None  # the ranks' user: only a new connection of theirs asks for a new look at their fds

    def _inodes(self, pid, now):
        folder = os.path.join(self.proc, str(pid), "fd")
        try:
            names = os.listdir(folder)
        except OSError:
            self.fds.pop(pid, None)
            return set()
        known = self.fds.get(pid, {})
        if now - self.refreshed.get(pid, -FD_REREAD) >= FD_REREAD:
            known, self.refreshed[pid] = {}, now
        fresh = {}
        for name in names:
            if name in known:
                fresh[name] = known[name]
                continue
            try:
                link = os.readlink(os.path.join(folder, name))
            except OSError:
                continue
            fresh[name] = int(link[8:-1]) if link.startswith("socket:[") and link[8:-1].isdigit() else None
        self.fds[pid] = fresh
        return {inode for inode in fresh.values() if inode is not None}

    def _shares_namespace(self, pid):
        try:
            return os.stat("/proc/self/ns/net").st_ino == os.stat(os.path.join(self.proc, str(pid), "ns", "net")).st_ino
        except OSError:
            return False

    def _connections(self, pids, now, busy):
        """Every established connection of the ranks' namespace, whether the ranks' sockets need a new scan, and
        whether the connections were read now (a quiet node's are not: the last reading's stand, without bytes)."""
        if self.same_ns is None:
            self.same_ns = bool(self.diag) and self._shares_namespace(pids[0])
            try:
                self.uid = os.stat(os.path.join(self.proc, str(pids[0]))).st_uid
            except OSError:
                self.uid = None
        if self.same_ns and self.netlink is None:
            self.netlink = diag_socket()
        # Between two looks at the fds, only the families the ranks' sockets are of (each dump costs the kernel
        # a walk of the namespace's sockets).
        due = self.scanned is None or self.scanned[1] != pids or now - self.scanned[0] >= FULL_REFRESH
        if not (due or busy):
            return self.listed, False, False
        families = (socket.AF_INET, socket.AF_INET6) if due or self.families is None else self.families
        listed = diag_sockets(self.netlink, families) if self.netlink is not None else None
        if listed is None and self.netlink is not None:
            self.netlink.close()  # refused or broken: the text table from now on
            self.netlink, self.same_ns = None, False
        if listed is not None:  # a new connection of the ranks' user: theirs, perhaps
            fresh = due or (now - self.scanned[0] >= self.RESCAN and any(
                inode not in self.known and conn[6] == self.uid for inode, conn in listed.items()))
            self.listed = listed
            return listed, fresh, True
        if due or now - self.scanned[0] >= self.RESCAN * 2:  # no diagnostics: the text table, now and then
            self.listed = {k: (*v, None, None, None, None) for k, v in tcp_table(self.proc, pids[0]).items()}
            return self.listed, True, True
        return self.listed, False, True

    def sample(self, pids, dt, store_port=None, now=0.0, busy=True):
        """``{nic: {"local>remote": {"n", "tx", "rx"}}}`` for the ranks ``pids`` (``dt``: seconds since the last).
        ``busy``: some NIC carries traffic worth attributing; on a quiet node the kernel is not asked for the
        connections' bytes (its walk of every socket is most of what this costs), only every ``FULL_REFRESH``."""
        pids = sorted(pids)
        for gone in set(self.fds) - set(pids):
            self.fds.pop(gone, None)
            self.refreshed.pop(gone, None)
        if not pids:
            return {}
        listed, scan, measured = self._connections(pids, now, busy)
        if scan:
            self.inodes = set()
            for pid in pids:
                self.inodes |= self._inodes(pid, now)
            self.scanned, self.known = (now, pids), set(listed)
            held = {listed[i][7] for i in self.inodes if i in listed}
            self.families = tuple(f for f in (socket.AF_INET, socket.AF_INET6) if f in held) or None
        if self.nets[2] is None or now - self.nets[2] >= FULL_REFRESH:
            self.nets = (*interfaces(self.proc, pids[0]), now)
        routes, six, _ = self.nets
        out, seen = {}, {}
        for inode in self.inodes:
            conn = listed.get(inode)
            if conn is None or (store_port and store_port in (conn[1], conn[3])):
                continue
            local, _, remote, _, sent, received, _, _ = conn
            nic = nic_of(local, routes, six) or "?"
            entry = out.setdefault(nic, {}).setdefault(local + ">" + remote, {"n": 0})
            entry["n"] += 1
            if sent is None or not measured:
                continue
            seen[inode] = (sent, received)
            before = self.last.get(inode)
            entry.setdefault("tx", 0)
            entry.setdefault("rx", 0)
            if before is not None and dt > 0:
                entry["tx"] += int(max(0, sent - before[0]) / dt)
                entry["rx"] += int(max(0, received - before[1]) / dt)
        if measured:  # a quiet sample keeps the last readings: the next delta holds its (few) bytes too
            self.last = seen
        return out
