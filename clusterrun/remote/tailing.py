"""Reading the rank log files torchrun writes (``--redirects 3``) and sending them on as ``out`` events.

Standard library only: this module travels to the nodes with the agent.
"""

import os
import re
import threading
import time

if __package__:
    from clusterrun.remote import protocol, wire
else:
    import protocol
    import wire

READ_CHUNK = 128 << 10  # bytes read from one rank file per turn: one ``out`` frame at most this big
MAX_RECORD = 1 << 20  # an unfinished line longer than this goes out in pieces (``open``) instead of being held
TAIL_FAST, TAIL_SLOW = 0.01, 0.1  # seconds between looks at the rank files: right after data, and when idle
#: ... and once no rank has written for QUIET_AFTER seconds: a look at every file ten times a second was most of
#: an idle agent's CPU (1.8 ms/s against 0.4 ms/s, measured on an 8-node job that sleeps), and on a large job
#: the agents' wakeups take the CPU its ranks need; a line after a long silence shows at most this much later.
TAIL_QUIET, QUIET_AFTER = 0.5, 3.0
#: Seconds between looks for the first rank file: torchrun is still starting (importing torch, its rendezvous),
#: and on a machine whose cores the ranks need now, an agent's every wakeup counts.
TAIL_NONE = 0.25


def _record_end(data: bytes) -> int:
    """Length of the longest prefix of ``data`` made of whole records (each ending in \\n or \\r).

    A \\r that is the last byte may be the first half of \\r\\n: that record waits for the next byte.
    """
    end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    if end == len(data) and data.endswith(b"\r"):
        end = max(data.rfind(b"\n", 0, -1), data.rfind(b"\r", 0, -1)) + 1
    return end


class RankFile:
    """One rank's stdout or stderr log, sent on as ``out`` events from ``offset`` on.

    Only whole records leave (a line, or a progress bar's update ending in \\r), so lines of the rank's two
    streams never mix in clusterrun's rank log; an unfinished record is held until its end arrives, or sent in
    pieces (``open``) once it is longer than MAX_RECORD. ``sent`` and ``lines`` count what went out.
    """

    def __init__(self, path: str, rank: int, local_rank: int, stream: str, offset: int = 0) -> None:
        self.path, self.rank, self.local_rank, self.stream = path, rank, local_rank, stream
        self.offset = offset  # read up to here
        self.sent = offset  # sent up to here (the rest of what was read is ``pending``)
        self.lines = 0  # newlines sent
        self.pending = b""
        self.open = False  # a piece of an unfinished record went out: this stream owns the rank's log line
        self.fh = None

    def key(self) -> str:
        return f"{self.rank}/{self.stream}"

    def _open(self) -> bool:
        if self.fh is None:
            try:
                self.fh = open(self.path, "rb")  # noqa: SIM115 - kept open while tailing
            except OSError:
                return False
            if self.offset:
                self.fh.seek(self.offset)
        return True

    def pump(self, final: bool = False) -> int:
        """Read at most READ_CHUNK new bytes and send what forms whole records. Returns the bytes read.

        ``final``: the file is complete (its writers are gone), so an unfinished last record goes out too.
        """
        if wire.is_broken() or not self._open():
            return 0  # nobody to send to (a detached run's connection is gone): the file stays as it is
        if not self.pending and os.fstat(self.fh.fileno()).st_size <= self.offset:
            return 0  # nothing new: one fstat, where a read would take (and give back) a 128 KiB buffer
        chunk = self.fh.read(READ_CHUNK)
        self.offset += len(chunk)
        data = self.pending + chunk if self.pending else chunk
        if not data:
            return 0
        at_end = final and not chunk
        cut = len(data) if at_end or len(data) >= MAX_RECORD else _record_end(data)
        if cut and not self._send(data[:cut], more=not at_end and data[cut - 1:cut] not in (b"\n", b"\r")):
            return len(chunk)
        self.pending = data[cut:]
        return len(chunk)

    def _send(self, data: bytes, more: bool) -> bool:
        ok = wire.emit({"ev": protocol.OUT, "rank": self.rank, "local_rank": self.local_rank, "stream": self.stream,
                   "open": more}, data)
        if ok:
            self.sent += len(data)
            self.lines += data.count(b"\n")
            self.open = more
        return ok

    def drained(self) -> bool:
        return not self.pending and self.fh is not None and self.offset >= os.fstat(self.fh.fileno()).st_size

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


_RANK_FILE = re.compile(r"attempt_(\d+)/(\d+)/(stdout|stderr)\.log$")


def rank_files(log_dir: str) -> list:
    """``(path, local_rank, "stdout" | "stderr")`` of every rank log file under torchrun's ``log_dir``
    (``<log_dir>/*/attempt_*/<local_rank>/{stdout,stderr}.log``), in a stable order; empty when there is none."""
    found = []
    if not os.path.isdir(log_dir):
        return found
    for top, _dirs, names in sorted(os.walk(log_dir)):
        for name in sorted(names):
            path = os.path.join(top, name)
            m = _RANK_FILE.search(path)
            if m:
                found.append((path, int(m.group(2)), m.group(3)))
    return found


class Tailer(threading.Thread):
    """Follows ``<log_dir>/*/attempt_*/<local_rank>/{stdout,stderr}.log`` as torchrun creates them.

    Every file gets a turn of at most READ_CHUNK bytes in each round, so one flooding rank cannot starve the
    others. After ``stop_event``, it reads every file to its end and sends all of it, then sets ``done``.
    """

    DISCOVER_EVERY = 0.2  # seconds between looks for new rank files while data flows
    # ... and once the ranks are quiet: torchrun creates every rank's files when it starts its workers, so a walk
    # of the log directory at each idle look (most of an idle agent's CPU) finds nothing new.
    DISCOVER_IDLE = 1.0

    def __init__(self, log_dir: str, rank_offset: int) -> None:
        super().__init__(daemon=True, name="tailer")
        self.log_dir, self.rank_offset = log_dir, rank_offset
        self.files: dict = {}
        self.started_at: dict = {}
        self.stop_event = threading.Event()
        self.done = threading.Event()
        self.progress = time.monotonic()  # last time a turn moved data (the final drain is judged by it)

    def _discover(self) -> None:
        for path, local_rank, stream in rank_files(self.log_dir):
            if path in self.files:
                continue
            rank = self.rank_offset + local_rank
            self.files[path] = RankFile(path, rank, local_rank, stream)
            self.started_at.setdefault(rank, time.time())

    def _round(self, final: bool = False) -> int:
        """One turn for every file whose rank's log line is not held open by its other stream."""
        files = list(self.files.values())
        owners = {f.rank: f for f in files if f.open}
        moved = 0
        for f in files:
            owner = owners.get(f.rank)
            if owner is not None and owner is not f:
                continue
            moved += f.pump(final)
            if f.open:
                owners[f.rank] = f
            elif owner is f:
                del owners[f.rank]
        return moved

    def run(self) -> None:
        try:
            wait, looked = TAIL_FAST, 0.0
            while not self.stop_event.is_set():
                now = time.monotonic()
                if not self.files or now - looked >= (self.DISCOVER_IDLE if wait >= TAIL_SLOW else self.DISCOVER_EVERY):
                    self._discover()
                    looked = now
                if self._round():
                    self.progress = time.monotonic()
                    wait = TAIL_FAST
                else:
                    self.stop_event.wait(wait if self.files else TAIL_NONE)
                    quiet = time.monotonic() - self.progress >= QUIET_AFTER
                    wait = min(TAIL_QUIET if quiet else TAIL_SLOW, wait * 2)
            # The job is over: every byte of every file goes out, whole records first, then what is left.
            self._discover()
            while not wire.is_broken():
                if self._round():
                    self.progress = time.monotonic()
                    continue
                if all(f.drained() or f.fh is None for f in self.files.values()):
                    break
                sent = sum(f.sent for f in self.files.values())
                if not self._round(final=True) and sum(f.sent for f in self.files.values()) == sent:
                    break  # nothing left that can move (a file vanished or shrank)
                self.progress = time.monotonic()
            for f in self.files.values():
                f.close()
        finally:
            self.done.set()

    def sizes(self) -> dict:
        """``{"<rank>/<stream>": {"bytes", "lines"}}``: what each file holds and (after ``done``) what was sent."""
        out = {}
        for f in self.files.values():
            try:
                size = os.path.getsize(f.path)
            except OSError:
                size = f.offset
            out[f.key()] = {"bytes": size, "sent": f.sent, "lines": f.lines if f.sent >= size else None}
        return out


def line_start_after(fh, pos: int) -> int:
    """The first offset at or after ``pos`` that starts a line (so a cut never splits one)."""
    if pos <= 0:
        return 0
    fh.seek(pos - 1)
    while True:
        block = fh.read(READ_CHUNK)
        if not block:
            return fh.tell()
        i = block.find(b"\n")
        if i >= 0:
            return fh.tell() - len(block) + i + 1


def count_lines(fh, start: int, end: int) -> int:
    """The newlines in ``fh`` between offsets ``start`` and ``end``."""
    fh.seek(start)
    count, left = 0, end - start
    while left > 0:
        block = fh.read(min(READ_CHUNK, left))
        if not block:
            break
        count += block.count(b"\n")
        left -= len(block)
    return count
