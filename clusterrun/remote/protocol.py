"""The node agent's wire protocol, written by :mod:`clusterrun.remote.agent` and read by clusterrun.

Agent -> clusterrun: one JSON object per line, an *event* ``{"ev": KIND, ...}``. An event with ``"n": N`` is
followed by exactly N raw bytes, its payload, which are not part of any line. A line that is not a JSON object
with an ``ev`` (a traceback of a Python too old for the agent, a shell's complaint) reads as a ``launcher``
event with that text, so nothing the node says is dropped.

Events of ``agent.py prepare`` before ``go`` (see session.py): ``ready`` (report, time: when the agent read its
check), ``listening`` (port, or error), ``reached`` (tcp, ping), ``pinged`` (results, missing), each the answer to
one command; after ``go``, those of ``run``.

Events of ``agent.py run``:

* ``started`` (pid, time): torchrun runs.
* ``out`` (rank, local_rank, stream, open; payload): rank output. The payload is whole records (each ending in
  ``\\n`` or ``\\r``) unless ``open``: then the record goes on in the next ``out`` of the same rank and stream,
  and nothing of the rank's other stream comes in between.
* ``launcher`` (text): a line of torchrun's own output. ``error`` (text): torchrun could not start.
* ``rank_failed`` (rank, local_rank, rc, signal, time): torchrun saw a worker fail.
* ``pong``: the answer to ``ping``.
* ``watching`` (port, address, nic; or error): the data-path watch listens (see pathwatch.py), or why not.
* ``path`` (peer, address, nic, state, since, time): a watched path is ``lost`` (no answer since ``since``) or
  ``ok`` again.
* ``load`` (cpu: {rank: share of one CPU since the last report}, time): every few seconds, for stragglers.
* ``sample`` (t, dt, nics, rdma, ranks, load, gpus, others, conns, env, gaps): every ``sample_every`` seconds,
  the node's series (sampler.py gives the keys).
* ``stack`` (rank, how, pid; payload: the dump's text) per worker after ``stacks``, then ``stacks_done`` (count).
* ``exit`` (rc, signal, reason, ranks, logs, watch, time: when torchrun ended): always last, sent after every byte of every rank
  file; ``logs`` gives each rank file's size and line count: ``{"<rank>/<stream>": {"bytes", "sent", "lines"}}``;
  ``watch`` the datagrams the watch sent and received.

Events of ``agent.py collect``: ``swept`` (pids) or ``alive`` (pids), then per rank file ``log`` (rank, stream,
bytes, lines, from, skipped_bytes, skipped_lines) and its ``out`` events, then ``record`` (exit: the node's
exit.json or null). Events of ``agent.py exec``: ``line`` (stream, text), then ``exit`` (rc, reason).

Events of ``agent.py sweep``: ``swept`` (pids); of ``agent.py ps``: ``alive`` (pids; for every run, with
``runs`` and ``leases``).

Every mode takes its spec the same way: ``agent.py MODE``, then the spec as the first line of stdin (base64
JSON); ``prepare`` takes the check's and the run's specs as ``check <spec>`` and ``go <spec>`` lines. Never on
the command line: the run's spec carries the job's environment (tokens, passwords), which any user of a node
can read in another process's command line. Each mode's spec is one :class:`Spec` below (``RUN``, ``EXEC``,
``COLLECT``, ``SWEEP``, ``PS``, ``CHECK``): its keys, their types and the one set of defaults, filled in by
:meth:`Spec.fill` on both sides. A spec with an unknown key, a missing required key or a value of the wrong
type is refused with an ``error`` event (text) and exit code 2 (the run mode sends ``exit`` after it, with
that reason), never a traceback.

clusterrun -> agent (``run`` and ``exec``): lines on stdin after the spec: ``ping`` (answered by ``pong``;
without one for the heartbeat timeout the agent stops its job), ``term`` (SIGTERM, SIGKILL after the grace period), ``kill`` (at
once), ``watch <json>`` (the data-path watch's targets: a list of {node, address, port}), ``stacks`` (dump
every worker's stack: py-spy, or the faulthandler hook of stackhook.py). The end of stdin
stops the job too, unless the run is detached.

Standard library only: this module travels to the nodes with the agent.
"""

from __future__ import annotations

import base64
import json

TYPE_CHECKING = False  # typing and dataclasses cost a node milliseconds at every start: types for checkers only
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any

# Event kinds (agent -> clusterrun).
STARTED, OUT, LAUNCHER, ERROR, RANK_FAILED, PONG, EXIT = ("started", "out", "launcher", "error", "rank_failed",
                                                          "pong", "exit")
SWEPT, ALIVE, LOG, RECORD, LINE = "swept", "alive", "log", "record", "line"
WATCHING, PATH = "watching", "path"
STACK, STACKS_DONE, LOAD, FLIGHT = "stack", "stacks_done", "load", "flight"
SAMPLE = "sample"
STREAM_ERROR = "stream_error"  # made by clusterrun's reader when a stream fails, never sent by an agent
# Commands (clusterrun -> agent), one per line on the agent's stdin.
PING, TERM, KILL, WATCH, STACKS = "ping", "term", "kill", "watch", "stacks"


def encode(event: dict[str, Any], payload: bytes = b"") -> bytes:
    """One event as it goes on the wire: its line, then its payload (``n`` is set from it)."""
    if payload:
        event = {**event, "n": len(payload)}
    return (json.dumps(event, separators=(",", ":")) + "\n").encode() + payload


MAX_HEADER = 1 << 20  # a "line" longer than this with no newline is not an event header: pass it on as text


class Frame:
    """One event and its payload (empty for most events)."""

    __slots__ = ("event", "payload")

    def __init__(self, event: dict[str, Any], payload: bytes = b"") -> None:
        self.event = event
        self.payload = payload

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Frame) and (self.event, self.payload) == (other.event, other.payload)

    __hash__ = None  # type: ignore[assignment]  # an event is a dict: frames are not hashable

    def __repr__(self) -> str:
        return f"Frame(event={self.event!r}, payload={self.payload!r})"


class FrameDecoder:
    """Turns the agent's byte stream, cut anywhere, into frames in order. Holds at most one unfinished frame."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need: int | None = None  # payload bytes still missing for ``_event``
        self._event: dict[str, Any] | None = None
        self._payload: list[bytes] = []

    def feed(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        pos, size = 0, len(data)
        while pos < size:
            if self._need is not None:
                take = data[pos:pos + self._need]
                self._payload.append(take)
                self._need -= len(take)
                pos += len(take)
                if self._need == 0:
                    assert self._event is not None
                    payload = self._payload[0] if len(self._payload) == 1 else b"".join(self._payload)
                    frames.append(Frame(self._event, payload))
                    self._need, self._event, self._payload = None, None, []
                continue
            end = data.find(b"\n", pos)
            if end < 0:
                self._buf += data[pos:]
                pos = size
                if len(self._buf) > MAX_HEADER:
                    frames.append(_text(bytes(self._buf)))
                    self._buf.clear()
                continue
            line = bytes(self._buf) + data[pos:end] if self._buf else data[pos:end]
            self._buf.clear()
            pos = end + 1
            frame = _header(line)
            length = frame.event.get("n") if frame.event.get("ev") != LAUNCHER else None
            if isinstance(length, int) and length > 0:
                self._event, self._need = frame.event, length
            else:
                frames.append(frame)
        return frames

    def close(self) -> list[Frame]:
        """What is left when the stream ends: an unfinished line as text, an unfinished payload as it is.

        A cut payload is returned with ``"cut": true`` in its event, so the caller can count it as incomplete.
        """
        frames: list[Frame] = []
        if self._need is not None and self._event is not None:
            frames.append(Frame({**self._event, "cut": True}, b"".join(self._payload)))
        elif self._buf:
            frames.append(_text(bytes(self._buf)))
        self._buf.clear()
        self._need, self._event, self._payload = None, None, []
        return frames


def _text(raw: bytes) -> Frame:
    return Frame({"ev": LAUNCHER, "text": raw.decode("utf-8", errors="replace").rstrip("\r")})


def _header(line: bytes) -> Frame:
    if line.startswith(b"{"):
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict) and "ev" in event:
            return Frame(event)
    return _text(line)


def frames(chunks: Iterable[bytes]) -> Iterator[Frame]:
    """Every frame of a whole stream of chunks."""
    decoder = FrameDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.close()


# ---------------------------------------------------------------- the modes' specs

#: Seconds between SIGTERM and SIGKILL when a run's processes are stopped (``up --grace``, ``down --grace``).
GRACE = 5.0
#: The data-path watch: seconds between two probes of one path, and without an answer before it is lost.
WATCH_INTERVAL, WATCH_DEAD_AFTER = 1.0, 5.0
#: How long a node's agent waits for clusterrun between two steps before the job (``--preflight full`` runs
#: doctor's network checks in between) before it gives up and ends.
IDLE = 1800.0
#: Per rank file, what ``collect`` sends at most (from the end, cut at a line start).
COLLECT_MAX_BYTES = 8 << 20

REQUIRED = object()  # a key without a default: a spec without it is refused


class SpecError(ValueError):
    """A spec that does not fit its mode (unknown key, missing required key, wrong type)."""


class Spec:
    """One mode's spec: its keys, each with the types it accepts and its default (or REQUIRED); a key whose
    value is itself a spec (``fields``) is that spec or null."""

    __slots__ = ("fields", "mode")

    def __init__(self, mode: str, fields: dict[str, tuple[Any, ...]]) -> None:
        self.mode = mode
        self.fields = fields

    def fill(self, spec: Any) -> dict[str, Any]:
        """``spec`` with every missing key set to its default. Raises :class:`SpecError` naming the key."""
        if not isinstance(spec, dict):
            raise SpecError(f"the {self.mode} spec is {type(spec).__name__}, not an object")
        unknown = sorted(set(spec) - set(self.fields))
        if unknown:
            raise SpecError(f"unknown key(s) in the {self.mode} spec: {', '.join(map(repr, unknown))} "
                            f"(known: {', '.join(sorted(self.fields))})")
        out = {}
        for key, (kinds, default, *inner) in self.fields.items():
            if key not in spec:
                if default is REQUIRED:
                    raise SpecError(f"the {self.mode} spec lacks {key!r}")
                out[key] = default() if callable(default) else default
                continue
            value = spec[key]
            if not _fits(value, kinds):
                raise SpecError(f"{self.mode} spec: {key!r} must be {' or '.join(_name(k) for k in kinds)}, "
                                f"not {type(value).__name__} {value!r:.60}")
            out[key] = inner[0].fill(value) if inner and value is not None else value
        return out


def _fits(value: Any, kinds: tuple[Any, ...]) -> bool:
    if isinstance(value, bool):
        return bool in kinds  # a bool is an int to Python, not to a spec
    if type(value) is int and float in kinds:
        return True
    return any(value is None if k is None else isinstance(value, k) for k in kinds)


def _name(kind: Any) -> str:
    return "null" if kind is None else kind.__name__


# (types, default[, the spec of its value]) per key. A callable default makes a fresh value each time.
WATCH_SPEC = Spec("watch", {
    "address": ((str, None), None),  # the node's data address the watch listens on (none: no watch)
    "nic": ((str, None), None),
    "interval": ((float,), WATCH_INTERVAL),
    "dead_after": ((float,), WATCH_DEAD_AFTER),
})
STACKS_SPEC = Spec("stacks", {
    "hook": ((str,), REQUIRED),  # the text of stackhook.py, written into the run directory
    "flight": ((bool,), False),  # torch's flight recorder on in the workers (the hang watch)
})
CONTAINER = Spec("container", {  # the plan's container command in parts (clusterrun/planning/container.py)
    "runtime": ((str,), REQUIRED),  # docker, podman or apptainer
    "image": ((str,), REQUIRED),
    "head": ((list,), REQUIRED),  # the runtime's run command up to the --env flags
    "options": ((list,), list),  # the user's, after the --env flags
    "labels": ((dict,), dict),  # the run's containers on this node carry these (removal by label)
    "env": ((dict,), dict),  # what the container sees instead of the node's values (CUDA_VISIBLE_DEVICES)
    "mounts": ((list,), list),  # the user's SRC:DST[:ro] (their sources are checked before the start)
    "pull": ((str,), "missing"),
})
RUN = Spec("run", {
    "run_id": ((str,), REQUIRED),
    "node": ((str,), ""),
    "argv": ((list,), REQUIRED),
    "script_args": ((int,), 0),  # how many of argv's last items are the script's own (never expanded)
    "env": ((dict,), dict),
    "cwd": ((str, None), None),  # none: the run directory
    "run_dir": ((str,), REQUIRED),
    "rank_offset": ((int,), 0),
    "grace": ((float,), GRACE),
    "heartbeat_timeout": ((float,), 0.0),  # 0: no watchdog
    "detached": ((bool,), False),
    "stage": ((list,), list),  # [cache path, destination, kind] per staged file
    "stacks": ((dict, None), None, STACKS_SPEC),
    "load_every": ((float,), 0.0),  # 0: no ``load`` events
    "sample_every": ((float,), 0.0),  # 0: no ``sample`` events (the node's series, sampler.py)
    "watch": ((dict, None), None, WATCH_SPEC),
    "gpus": ((list,), list),  # the GPUs the run leases on this node for its whole life (see leases.py)
    "container": ((dict, None), None, CONTAINER),  # none: torchrun runs on the host
})
EXEC = Spec("exec", {
    "command": ((str,), REQUIRED),
    "timeout": ((float,), 0.0),  # 0: none
})
COLLECT = Spec("collect", {
    "run_id": ((str,), REQUIRED),
    "node": ((str,), ""),
    "run_dir": ((str,), REQUIRED),
    "rank_offset": ((int,), 0),
    "sweep": ((bool,), True),  # stop what is left first; else only say whether it still runs
    "grace": ((float,), GRACE),
    "max_bytes": ((int,), COLLECT_MAX_BYTES),
    "skip": ((dict,), dict),  # {"<rank>/<stream>": bytes already received}
    "partial": ((bool,), True),  # send an unfinished last line too (the run is over)
    "container": ((dict, None), None, CONTAINER),  # the run's containers here are removed by label with the rest
})
SWEEP = Spec("sweep", {
    "run_id": ((str,), REQUIRED),
    "node": ((str,), ""),  # two inventory nodes may be one machine: only this node's processes
    "grace": ((float,), GRACE),
    "container": ((dict, None), None, CONTAINER),  # the run's containers here are removed by label too
})
PS = Spec("ps", {
    "run_id": ((str,), REQUIRED),  # "": every run on the node (``clusterrun ps``)
    "node": ((str,), ""),
    "container": ((dict, None), None, CONTAINER),  # the run's containers here are listed too
})
WARM = Spec("warm", {  # the job's torchrun, started at the check to import torch meanwhile (warm.py)
    "python": ((str,), REQUIRED),  # the job's interpreter (its argv[0])
    "env": ((dict,), dict),  # the job's environment as planned before the check
    "cwd": ((str, None), None),  # its directory (null: the run directory)
})
CHECK = Spec("check", {
    "run_dir": ((str,), REQUIRED),
    "cache": ((str,), REQUIRED),  # the node's content cache of staged files
    "hashes": ((list,), list),  # the staged files' sha256, to look for in the cache
    "port": ((int, None), None),  # the master port the user gave, to lease and find free (rank 0)
    "choose_port": ((bool,), False),  # no port given: lease a free one (rank 0) and report it
    "run_id": ((str,), ""),  # who holds the leases taken (in their files, for other runs to name)
    "node": ((str,), ""),
    "idle": ((float,), IDLE),
    "container": ((dict, None), None, CONTAINER),  # the image is checked instead of the host's torch
    "python": ((str,), "python3"),  # the interpreter the job runs (inside the image, with a container)
    "env": ((dict,), dict),  # the job's environment: the runtime is asked with it, as it runs the job with it
    "warm": ((dict, None), None, WARM),  # start the job's torchrun now (null: at go)
})
MIRROR = Spec("mirror", {  # a detached run's record from its supervisor's node (mirror.py)
    "run_id": ((str,), REQUIRED),
    "node": ((str,), REQUIRED),  # the supervisor's node marker (clusterrun.detached.host.marker_node)
    "dir": ((str,), REQUIRED),  # the record's directory there
    "have": ((dict,), dict),  # {path under dir: bytes the caller has} of its log files
    "max_bytes": ((int,), COLLECT_MAX_BYTES),  # per file, per call
    "stop": ((str, None), None),  # who asks the run to stop (clusterrun down), or null
})
SPECS = {spec.mode: spec for spec in (RUN, EXEC, COLLECT, SWEEP, PS, CHECK, MIRROR)}


def encode_spec(spec: dict[str, Any]) -> str:
    """A spec as it travels: one line of base64 JSON (no newline)."""
    return base64.b64encode(json.dumps(spec, separators=(",", ":")).encode()).decode("ascii")


def decode_spec(kind: Spec, raw: bytes | str) -> dict[str, Any]:
    """The spec of mode ``kind`` from its line, filled. Raises :class:`SpecError` for anything wrong with it."""
    raw = raw.strip()
    if not raw:
        raise SpecError(f"no {kind.mode} spec (clusterrun went away before sending it)")
    try:
        spec = json.loads(base64.b64decode(raw, validate=True).decode())
    except ValueError as exc:  # binascii.Error and UnicodeDecodeError are ValueErrors
        raise SpecError(f"the {kind.mode} spec is not base64 JSON: {exc}") from None
    return kind.fill(spec)
