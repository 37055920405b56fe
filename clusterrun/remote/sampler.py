"""The node's series during a run: every ``every`` seconds one ``sample`` of the NICs, the RDMA ports, the ranks,
the node's load, the run's GPUs and the ranks' own connections.

One sample (rates in bytes per second since the previous sample, ``dt`` seconds before ``t``)::

    {"t": <wall time>, "dt": <seconds>,
     "nics": {name: [rx, tx]},                     # /sys/class/net/<name>/statistics/{rx,tx}_bytes
     "rdma": {"<hca>/<port>": [rx, tx]},           # port_{rcv,xmit}_data (4-byte units), where present
     "ranks": {global rank: {"pid", "cpu": share of one CPU, "rss": bytes}},
     "load": <1-minute load average>,
     "gpus": {physical index: {"util": %, "mem": MiB, "power": W, "temp": C, "energy": J}},
     "others": {pid: {"gpu": index, "mem": MiB}},   # processes of no rank of this run on the run's GPUs
     "conns": {nic: {"<local>><remote>": {"n", "tx", "rx"}}},   # the ranks' TCP connections (ranksockets.py)
     "env": {variable: value},                     # what the ranks started with, of the network variables
     "gaps": {what: why}}                          # what this sample lacks, and why

The roots (``sys_root``, ``proc``, the nvidia-smi command) are parameters, so tests point them at trees of
their own. Nothing read here can stop the sampler: a NIC that disappears, a counter that goes back, a /sys that
cannot be read, a nvidia-smi that hangs each leave a gap with its reason.

Standard library only: this module travels to the nodes with the agent.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

if __package__:
    from clusterrun.remote import gpuloop, protocol, ranksockets
else:
    import gpuloop
    import protocol
    import ranksockets

#: The ranks' variables that choose their network, reported in each sample (the verdict names the one to blame).
NET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_DISABLE",
            "NCCL_NET", "MASTER_ADDR", "MASTER_PORT")
WRAP32 = 1 << 32
#: A NIC at this many bytes per second or more makes the ranks' connections worth their bytes (below it, the
#: kernel is not asked for them: a quiet node's sampling costs less).
BUSY = 100_000


def _read_int(path):
    with open(path, "rb") as fh:
        return int(fh.read().split()[0])


def _net_dev(path):
    """``{nic: (rx bytes, tx bytes)}`` from /proc/net/dev, or None where it cannot be read."""
    try:
        with open(path, "rb") as fh:
            lines = fh.read().decode(errors="replace").splitlines()[2:]
    except OSError:
        return None
    out = {}
    for line in lines:
        name, _, rest = line.partition(":")
        cells = rest.split()
        if len(cells) >= 9 and cells[0].isdigit() and cells[8].isdigit():
            out[name.strip()] = (int(cells[0]), int(cells[8]))
    return out


class Counters:
    """Rates from counters that only grow: a counter that goes back is a 32-bit wrap when that explains it
    (less than half the range since), else a reset; either way the gap says so."""

    def __init__(self):
        self.last = {}  # key -> (value, monotonic time)

    def rate(self, key, value, now, scale=1):
        """``(bytes per second, None)`` or ``(None, why)`` for counter ``key`` at ``value`` now."""
        before = self.last.get(key)
        self.last[key] = (value, now)
        if before is None or now <= before[1]:
            return None, None  # the first reading: nothing to compare with yet (not a gap)
        delta = value - before[0]
        if delta < 0:
            if before[0] < WRAP32 and 0 <= value + WRAP32 - before[0] < WRAP32 // 2:
                delta = value + WRAP32 - before[0]
            else:
                return None, "counter went back from %d to %d (reset: the device was re-created or its driver " \
                             "reloaded)" % (before[0], value)
        return int(delta * scale / (now - before[1])), None

    def forget(self, keep):
        for key in set(self.last) - set(keep):
            del self.last[key]


def _proc_stat(proc, pid):
    """(CPU seconds of ``pid`` and the children it waited for, RSS bytes); raises OSError/ValueError."""
    with open(os.path.join(proc, str(pid), "stat"), "rb") as fh:
        stat = fh.read()
    fields = stat[stat.rfind(b")") + 2:].split()
    cpu = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return cpu, int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


def environ(proc, pid):
    """``pid``'s starting environment (what this user may read of it): {} where it cannot be read."""
    try:
        with open(os.path.join(proc, str(pid), "environ"), "rb") as fh:
            items = fh.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


class Sampler:
    """The node's samples. ``ranks()``: ``{global rank: pid}`` of the run's workers now; ``gpus``: the run's
    physical GPU indices; ``smi``: the nvidia-smi to run (None: found on PATH where there are GPUs; "": none)."""

    def __init__(self, ranks, gpus=(), sys_root="/sys", proc="/proc", smi=None, run_id="", diag=True, every=1.0,
                 apps_every=10.0):
        self.ranks = ranks
        self.sys_root = sys_root
        self.proc = proc
        self.run_id = run_id
        self.counters = Counters()
        self.cpu = {}  # pid -> (cpu seconds, monotonic)
        self.env = {}  # pid -> the ranks' network variables
        self.sockets = ranksockets.RankSockets(proc, diag)
        self.nics_seen = set()
        self.last = None
        tool = shutil.which("nvidia-smi") if smi is None and gpus else smi
        self.gpu = gpuloop.GpuLoop(tool, gpus, every, apps_every=apps_every) if tool else None

    def _pair(self, kind, key, files, now, sample, gaps, scale=1):
        """The rx/tx rates of counter files ``files`` (or the two values themselves) into ``sample[kind][key]``,
        or a gap; the keys read."""
        gap = ("nic " if kind == "nics" else "rdma ") + key
        try:
            rx, tx = (files if isinstance(files[0], int) else (_read_int(files[0]), _read_int(files[1])))
        except (OSError, ValueError, IndexError) as exc:
            gaps[gap] = "cannot read its counters: %s" % (getattr(exc, "strerror", None) or exc)
            return []
        if scale != 1 and WRAP32 - 1 in (rx, tx):  # an RDMA port's 32-bit counters stop at their top
            gaps[gap] = "32-bit counter saturated (read the extended counters, or reset it)"
            return []
        (rrx, why), (rtx, why2) = self.counters.rate(key + "/rx", rx, now, scale), self.counters.rate(key + "/tx", tx, now, scale)
        if why or why2:
            gaps[gap] = why or why2
        elif rrx is not None:
            sample.setdefault(kind, {})[key] = [rrx, rtx]
        return [key + "/rx", key + "/tx"]

    def _nics(self, now, sample, gaps):
        """Every NIC's counters: /proc/net/dev, all in one read (76 files of /sys for 38 NICs cost a node more
        than everything else the sampler reads), else /sys/class/net/<nic>/statistics."""
        counters = _net_dev(os.path.join(self.proc, "net", "dev"))
        base = os.path.join(self.sys_root, "class", "net")
        if counters is None:
            try:
                names = sorted(os.listdir(base))
            except OSError as exc:
                gaps["nics"] = "cannot read %s: %s" % (base, exc.strerror or exc)
                return []
            counters = {}
            for name in names:
                stats = os.path.join(base, name, "statistics")
                counters[name] = (os.path.join(stats, "rx_bytes"), os.path.join(stats, "tx_bytes"))
        keys, last, nics = [], self.counters.last, {}
        for name, pair in sorted(counters.items()):
            rx, tx = pair
            before_rx, before_tx = last.get(name + "/rx"), last.get(name + "/tx")
            if isinstance(rx, int) and before_rx and before_tx and rx >= before_rx[0] and tx >= before_tx[0] \
                    and now > before_rx[1]:  # the usual case, quickly: both counters grew
                span = now - before_rx[1]
                nics[name] = [int((rx - before_rx[0]) / span), int((tx - before_tx[0]) / span)]
                last[name + "/rx"], last[name + "/tx"] = (rx, now), (tx, now)
                keys += [name + "/rx", name + "/tx"]
            else:
                keys += self._pair("nics", name, pair, now, sample, gaps)
        if nics:
            sample.setdefault("nics", {}).update(nics)
        for gone in self.nics_seen - set(counters):
            gaps["nic " + gone] = "gone (no longer listed by the kernel)"
        self.nics_seen = set(counters)
        return keys

    def _rdma(self, now, sample, gaps):
        base = os.path.join(self.sys_root, "class", "infiniband")
        try:
            hcas = sorted(os.listdir(base))
        except OSError:
            return []  # no RDMA on this node
        keys = []
        for hca in hcas:
            try:
                ports = sorted(p for p in os.listdir(os.path.join(base, hca, "ports")) if p.isdigit())
            except OSError:
                continue
            for port in ports:
                folder = os.path.join(base, hca, "ports", port, "counters")
                keys += self._pair("rdma", hca + "/" + port, (os.path.join(folder, "port_rcv_data"),
                                   os.path.join(folder, "port_xmit_data")), now, sample, gaps, scale=4)
        return keys

    def _ranks(self, ranks, now, sample, gaps):
        out = {}
        for rank, pid in sorted(ranks.items()):
            try:
                used, rss = _proc_stat(self.proc, pid)
            except (OSError, ValueError, IndexError):
                gaps["rank %s" % rank] = "pid %d gone" % pid
                continue
            before = self.cpu.get(pid)
            self.cpu[pid] = (used, now)
            entry = {"pid": pid, "rss": rss}
            if before is not None and now > before[1]:
                entry["cpu"] = round((used - before[0]) / (now - before[1]), 3)
            out[str(rank)] = entry
            if pid not in self.env:
                own = environ(self.proc, pid)
                self.env[pid] = {k: own[k] for k in NET_VARS if k in own}
        alive = set(ranks.values())
        for pid in set(self.cpu) - alive:
            self.cpu.pop(pid, None)
            self.env.pop(pid, None)
        if out:
            sample["ranks"] = out
        env = {}
        for pid in sorted(alive):
            for key, value in self.env.get(pid, {}).items():
                env.setdefault(key, value)
        if env:
            sample["env"] = env
        return env

    def _load(self, sample, gaps):
        try:
            with open(os.path.join(self.proc, "loadavg")) as fh:
                sample["load"] = float(fh.read().split()[0])
        except (OSError, ValueError, IndexError) as exc:
            gaps["load"] = "cannot read loadavg: %s" % (getattr(exc, "strerror", None) or exc)

    def _gpus(self, ranks, sample, gaps):
        readings, apps, why = self.gpu.read()
        if why:
            gaps["gpus"] = why
        if readings:
            sample["gpus"] = {str(i): {k: v for k, v in r.items() if v is not None} for i, r in sorted(readings.items())}
        ours = set(ranks.values())
        others = {}
        for index, pid, mem in apps:
            if pid in ours or (self.run_id and environ(self.proc, pid).get(protocol.RUN_ID_VAR) == self.run_id):
                continue
            others[str(pid)] = {"gpu": index, "mem": mem}
        if others:
            sample["others"] = others

    def sample(self, now=None, wall=None):
        """One sample (see the module's docstring)."""
        now = time.monotonic() if now is None else now
        sample = {"t": round(time.time() if wall is None else wall, 3), "dt": round(now - self.last, 3) if self.last is not None else 0.0}
        gaps = {}
        try:
            ranks = dict(self.ranks())
        except (OSError, ValueError) as exc:
            ranks, gaps["ranks"] = {}, "cannot list the ranks: %s" % exc
        keys = self._nics(now, sample, gaps) + self._rdma(now, sample, gaps)
        self.counters.forget(keys)
        env = self._ranks(ranks, now, sample, gaps)
        self._load(sample, gaps)
        if self.gpu is not None:
            self._gpus(ranks, sample, gaps)
        port = env.get("MASTER_PORT", "")
        busy = any(sum(pair) >= BUSY for nic, pair in sample.get("nics", {}).items() if nic != "lo")
        conns = self.sockets.sample(list(ranks.values()), now - self.last if self.last is not None else 0.0,
                                    int(port) if port.isdigit() else None, now, busy or not sample.get("nics"))
        if conns:
            sample["conns"] = conns
        if gaps:
            sample["gaps"] = gaps
        self.last = now
        return sample

    def run(self, every, emit, stop, until=None):
        """Sample every ``every`` seconds and ``emit`` each, until ``stop`` is set or ``until()`` is true. A sample
        that fails in a way not foreseen is a gap with the error, and the next one is taken as usual."""
        if self.gpu is not None:
            self.gpu.start()
        try:
            first = True  # the counters' first readings: the next sample has rates
            while True:
                try:
                    sample = self.sample()
                    if not first:
                        emit(sample)
                except Exception as exc:  # a sampler that dies takes the series with it: this sample is a gap instead
                    emit({"t": round(time.time(), 3), "dt": 0.0, "gaps": {"sampler": "%s: %s" % (type(exc).__name__, exc)}})
                first = False
                if stop.wait(every) or (until is not None and until()):
                    return
        finally:
            if self.gpu is not None:
                self.gpu.close()

    def start(self, every, emit, stop, until=None):
        """:meth:`run` in a daemon thread; returns the thread."""
        thread = threading.Thread(target=self.run, args=(every, emit, stop, until), daemon=True, name="sampler")
        thread.start()
        return thread
