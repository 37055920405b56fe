"""The node agent's answers (agent -> clusterrun), as clusterrun reads them: one spec per event kind, which is
also the typed, immutable event the kind is decoded into, once, where frames are read (clusterrun/agents/link.py,
with :func:`clusterrun.remote.decode.decode`).

Each kind is one ``NamedTuple`` below: its fields, their types and their defaults are the kind's spec, as
:class:`clusterrun.remote.protocol.Spec` is a request's (a field without a default is required; ``ev``, the kind,
is a class attribute). Reading one received event (a JSON object):

* a required field missing, or a field of the wrong type (a bool is no int; an int is a float), is an error that
  names the node, the kind and the field: that node's failure, never a traceback;
* a missing optional field takes its default; a field no spec names is dropped (a newer agent may say more);
* a field whose type is another spec here (the ready check's :class:`ReadyReport`, the exit's :class:`RankReport`
  per rank) is read with it, and a ``dict[str, X]`` of them value by value;
* a kind no spec names (a newer agent's) is :class:`Unknown`, its fields as sent: the readers pass over it.

The wire stays as protocol.py writes it: this module only describes it. It is not shipped to the agent (which never
reads answers); the cluster supervisor (Python 3.10 or newer, remote/bundle.py) takes it with agents/link.py.
Standard library only.
"""

from __future__ import annotations

import typing
from typing import Any, NamedTuple

# ---------------------------------------------------------------- parts of answers


class RankReport(NamedTuple):
    """One rank's end in an ``exit`` (``ranks``: by global rank): from torchrun's summary and the rank's log."""

    rc: int | None = None
    signal: int | None = None
    time: Any = None  # when torchrun says it failed (its summary's text)
    started: float | None = None  # its log's first line (the node's clock)
    root_cause: bool = False  # torchrun named it the root cause


class LogSize(NamedTuple):
    """One rank file in an ``exit`` (``logs``: by ``"<rank>/<stream>"``): its size, what went out, its lines."""

    bytes: int
    sent: int | None = None
    lines: int | None = None


class RunProcs(NamedTuple):
    """One run's processes on a node (``alive``'s ``runs``: by run id)."""

    pids: list[int] = []  # noqa: RUF012 - a default, copied for each answer
    nodes: list[str] = []  # noqa: RUF012
    user: str = "?"
    since: float | None = None


class Leases(NamedTuple):
    """The leases held on a node, every user's (``alive``'s ``leases``): {index or port: holder record}."""

    gpus: dict[str, Any] = {}  # noqa: RUF012
    ports: dict[str, Any] = {}  # noqa: RUF012


class ReadyReport(NamedTuple):
    """The node's ready check (clusterrun/remote/ready.py): its Python, torch and facts; ``problems`` say why it
    cannot run the job, ``missing`` the staged files (sha256) its cache lacks."""

    python: str
    problems: list[str]
    missing: list[str]
    executable: str = ""
    torch: str = ""
    no_torch: bool = False
    image_id: str | None = None
    pulled: bool = False
    master_port: int | None = None  # leased for the run (rank 0, no port given)
    net: dict[str, Any] | None = None
    gpus: int | None = None
    gpu_model: str | None = None
    gpu: dict[str, Any] | None = None
    leases: dict[str, Any] | None = None
    topology_addr: str | None = None


# ---------------------------------------------------------------- the kinds (see protocol.py for when each comes)


class Started(NamedTuple):
    """torchrun runs; ``warm``: it was started at the check (importing torch since ``since``), else ``cold`` why not."""

    pid: int
    time: float
    warm: bool = False
    since: float | None = None
    cold: str | None = None
    ev = "started"


class Out(NamedTuple):
    """Rank output (its frame's payload); ``open``: the record goes on in the next; ``cut``: the stream ended
    within the payload (set by clusterrun's reader)."""

    rank: int
    stream: str
    local_rank: int = 0
    open: bool = False
    cut: bool = False
    ev = "out"


class Said(NamedTuple):
    """Words of the node, of three kinds: ``launcher``, a line of torchrun's own output (or a line that was no
    event); ``error``, the agent could not do what it was asked (a refused spec, torchrun not started);
    ``stream_error``, made by clusterrun's reader when the node's stream fails (or says what cannot be read)."""

    ev: str
    text: str
    time: float | None = None


class RankFailed(NamedTuple):
    """torchrun saw a worker fail."""

    rank: int
    rc: int
    local_rank: int = 0
    signal: int | None = None
    time: float | None = None
    ev = "rank_failed"


class Pong(NamedTuple):
    """The answer to ``ping``."""

    ev = "pong"


class Watching(NamedTuple):
    """The data-path watch listens on ``port`` (at ``address``, ``nic``), or ``error`` says why not."""

    port: int | None = None
    address: str | None = None
    nic: str | None = None
    error: str | None = None
    ev = "watching"


class Path(NamedTuple):
    """A watched path to ``peer`` is ``lost`` (no answer since ``since``) or ``ok`` again."""

    peer: str
    address: str
    state: str
    nic: str | None = None
    since: float | None = None
    answered: bool = True  # the peer ever answered
    time: float | None = None
    ev = "path"


class Load(NamedTuple):
    """Each rank's share of one CPU since the last report (``cpu``: by rank)."""

    cpu: dict[str, float]
    time: float | None = None
    ev = "load"


class Sample(NamedTuple):
    """The node's series at ``t`` (clusterrun/remote/sampler.py says what each key holds)."""

    t: float
    dt: float | None = None
    nics: dict[str, Any] | None = None
    rdma: dict[str, Any] | None = None
    ranks: dict[str, Any] | None = None
    load: float | None = None
    gpus: dict[str, Any] | None = None
    others: dict[str, Any] | None = None
    conns: dict[str, Any] | None = None
    env: dict[str, Any] | None = None
    gaps: dict[str, Any] | None = None
    ev = "sample"

    def series(self) -> dict[str, Any]:
        """The sample as the series keeps it: its keys that were sent."""
        return {key: value for key, value in self._asdict().items() if value is not None}


class Stack(NamedTuple):
    """One worker's stack (the payload), taken ``how``."""

    rank: int
    how: str = "none"
    pid: int | None = None
    ev = "stack"


class Flight(NamedTuple):
    """One rank's flight recorder (the payload): asked for (``json``) or torch's own dump (``timeout``)."""

    rank: int
    format: str = "json"
    pid: int | None = None
    why: str | None = None
    path: str | None = None
    ev = "flight"


class StacksDone(NamedTuple):
    """Every stack was sent."""

    count: int = 0
    ev = "stacks_done"


class Exit(NamedTuple):
    """The end: of ``run`` (after every byte of every rank file; also the node's exit.json), or of ``exec``."""

    rc: int
    signal: int | None = None
    reason: str | None = None
    time: float | None = None  # when torchrun ended
    ranks: dict[str, RankReport] = {}  # noqa: RUF012 - a default, copied for each answer
    logs: dict[str, LogSize] = {}  # noqa: RUF012
    watch: dict[str, Any] | None = None  # the datagrams the watch sent and received
    gpus_after: dict[str, Any] | None = None
    error: str | None = None  # exec: the command could not start
    ev = "exit"


class Ready(NamedTuple):
    """The answer to the ready check."""

    report: ReadyReport
    time: float | None = None  # when the agent read the check
    ev = "ready"


class Listening(NamedTuple):
    """A port listens (the path probe's, or the cluster supervisor's: its ``pid``), or ``error`` says why not."""

    port: int | None = None
    error: str | None = None
    pid: int | None = None
    ev = "listening"


class Reached(NamedTuple):
    """A path probe: ``tcp``, why the connection failed (None: it worked); then ``ping``: ok, failed or missing."""

    tcp: str | None = None
    ping: str | None = None
    ev = "reached"


class Pinged(NamedTuple):
    """Pings to many peers: ``results`` by address; ``missing``: no ping on the node."""

    results: dict[str, str] = {}  # noqa: RUF012
    missing: bool = False
    ev = "pinged"


class Pulling(NamedTuple):
    """The node pulls the run's image (``seconds`` so far)."""

    image: str = ""
    seconds: float = 0.0
    ev = "pulling"


class Relayed(NamedTuple):
    """The agent now answers to the run's supervisor."""

    ev = "relayed"


class Going(NamedTuple):
    """The cluster supervisor started the job."""

    time: float | None = None
    ev = "going"


class Swept(NamedTuple):
    """The processes stopped (and containers removed)."""

    pids: list[int] = []  # noqa: RUF012
    containers: Any = None
    ev = "swept"


class Alive(NamedTuple):
    """The processes still there; without a run id, every run's (``runs``) and the node's ``leases``."""

    pids: list[int] = []  # noqa: RUF012
    runs: dict[str, RunProcs] = {}  # noqa: RUF012 - without a run id: every run's
    leases: Leases | None = None  # without a run id
    containers: Any = None
    ev = "alive"


class Log(NamedTuple):
    """One rank file that ``collect`` sends next (its ``out`` events follow)."""

    rank: int
    stream: str
    bytes: int
    lines: int | None = None
    skipped_bytes: int = 0
    skipped_lines: int = 0
    ev = "log"


class Record(NamedTuple):
    """The node's exit.json (None: the job left none)."""

    exit: Exit | None = None
    ev = "record"


class Line(NamedTuple):
    """A line the command of ``exec`` printed."""

    text: str
    stream: str = "stdout"
    ev = "line"


class File(NamedTuple):
    """A part of a record's file (the payload) from ``offset``; ``whole``: the file from its start."""

    path: str
    offset: int = 0
    whole: bool = False
    ev = "file"


class Supervisor(NamedTuple):
    """Whether the run's supervisor lives there, and whether it was asked to stop."""

    alive: bool = False
    pid: int | None = None
    asked: bool = False
    ev = "supervisor"


class Unknown(NamedTuple):
    """A kind this clusterrun does not know (a newer agent's): its fields as sent."""

    ev: str
    fields: dict[str, Any]


#: Every answer of a known kind.
Answer = typing.Union[Started, Out, Said, RankFailed, Pong, Watching, Path, Load, Sample, Stack, Flight, StacksDone,
                      Exit, Ready, Listening, Reached, Pinged, Pulling, Relayed, Going, Swept, Alive, Log, Record, Line,
                      File, Supervisor]
#: The answer type of each kind.
KINDS: dict[str, type] = {"launcher": Said, "error": Said, "stream_error": Said,
                          **{cls.ev: cls for cls in typing.get_args(Answer) if cls is not Said}}
