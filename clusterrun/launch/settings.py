"""How a run is asked for and how it behaves: heartbeats, stop and drain bounds, the watches, the time limit, the
restarts, the check before the start, and what the terminal shows.

One frozen :class:`LaunchRequest` per ``clusterrun up``, made once from the command line over the inventory's
``run`` settings (:meth:`LaunchRequest.from_flags`) and passed down whole. Its supervision part,
:class:`SupervisorSettings`, is spaced out for large runs (:meth:`SupervisorSettings.paced`) and travels to a
detached run's supervisor on the cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from clusterrun.remote import protocol

if TYPE_CHECKING:  # standard library only at run time: the cluster supervisor of a detached run takes these settings
    from clusterrun.inventory.models import RunSettings

#: On a large run, at most about this many heartbeats, and CPU reports, reach clusterrun each second.
BEATS_PER_SECOND = 32.0
LOADS_PER_SECOND = 32 / 3  # 32 nodes report every 3 s, as given


class _Mode(str, Enum):
    """A choice of the command line and the inventory, written as its value (in JSON, messages and f-strings)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Preflight(_Mode):
    """``up --preflight``: the check of the data paths before the job starts."""

    quick = "quick"  # every node reaches rank 0's master port on the data network
    full = "full"  # doctor's network checks too
    off = "off"


class OnPathLoss(_Mode):
    """``--on-path-loss``: what a dead data path does."""

    stop = "stop"  # the job is stopped: its ranks would only wait for NCCL's or gloo's timeout
    warn = "warn"  # reported; the job goes on


class OnHang(_Mode):
    """``--on-hang``: what happens after the stacks of a hang are taken."""

    wait = "wait"  # a reminder every hang timeout
    stop = "stop"


@dataclass(frozen=True)
class SupervisorSettings:
    grace: float = protocol.GRACE  # seconds between SIGTERM and SIGKILL on each node (``up --grace``)
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 15.0  # an agent that hears nothing for this long stops its node
    stop_timeout: float = 10.0  # after asking nodes to stop: how long one may send nothing before we give up on it
    drain_timeout: float = 600.0  # ... and how long one may go on sending its logs at most
    queue_size: int = 512  # frames in flight (each at most 128 KiB of output); readers block beyond this
    timeout: float | None = None  # the whole job: past this many seconds it is stopped and fails (exit 124)
    path_watch: bool = True  # the agents watch the job's data paths (more than one node)
    on_path_loss: OnPathLoss = OnPathLoss.stop
    watch_interval: float = protocol.WATCH_INTERVAL  # seconds between two probes of one path
    watch_dead_after: float = protocol.WATCH_DEAD_AFTER  # seconds without an answer before a path is lost
    hang_timeout: float | None = None  # no output from any rank for this long: every rank's stack, a digest
    on_hang: OnHang = OnHang.wait  # after the digest: wait, or stop the job
    load_every: float = 3.0  # seconds between the agents' CPU reports (stragglers); 0: none
    sample_every: float = 1.0  # seconds between the nodes' samples of NICs, ranks and GPUs (0: none)

    def __post_init__(self) -> None:  # from JSON (a detached run's spec) the modes come as their values
        object.__setattr__(self, "on_path_loss", OnPathLoss(self.on_path_loss))
        object.__setattr__(self, "on_hang", OnHang(self.on_hang))

    def paced(self, nodes: int) -> SupervisorSettings:
        """These settings for a run of ``nodes`` nodes: heartbeats and CPU reports spaced out on large runs, so
        that clusterrun handles about as many of them per second at 256 nodes as at 32 (each costs a fraction of
        a millisecond of its CPU, and a short run on many nodes lasts a minute). The heartbeat timeout grows by
        four times what the interval grew: a node is still declared lost only after four heartbeats in a row
        went unanswered, as with the given settings."""
        beat = max(self.heartbeat_interval, nodes / BEATS_PER_SECOND)
        timeout = self.heartbeat_timeout + 4 * (beat - self.heartbeat_interval)
        load = max(self.load_every, nodes / LOADS_PER_SECOND) if self.load_every else 0.0
        return dataclasses.replace(self, heartbeat_interval=beat, heartbeat_timeout=timeout, load_every=load)


@dataclass(frozen=True)
class RestartSettings:
    """``--max-restarts``, ``--min-nodes``, ``--restart-backoff`` (or the inventory's ``run`` section)."""

    max_restarts: int = 0
    min_nodes: int | None = None  # None: every node is needed
    backoff: float = 5.0  # seconds before the first restart; doubling, at most a minute

    @property
    def may_drop(self) -> bool:
        return self.min_nodes is not None


@dataclass(frozen=True)
class Terminal:
    """What the terminal shows of the ranks' output (the rank logs always hold every line)."""

    ranks: frozenset[int] | None = None  # ``--ranks``: only these global ranks' lines (None: every rank's)
    quiet: bool = False  # ``-q``: no rank output at all
    raw: bool = False  # ``--raw``: control characters as they came
    fold: bool = True  # identical lines of many ranks shown once (``--fold/--no-fold``, ``run.fold``)


@dataclass(frozen=True)
class LaunchRequest:
    """Everything one ``clusterrun up`` asks for beyond the plan: made once (:meth:`from_flags`), passed down whole."""

    supervision: SupervisorSettings = field(default_factory=SupervisorSettings)
    restarts: RestartSettings = field(default_factory=RestartSettings)
    preflight: Preflight = Preflight.quick
    detach: bool = False  # start the job, hand it to its supervisor on rank 0's node and return
    notify: tuple[str, ...] = ()  # webhooks told of the start, a failure and the end
    terminal: Terminal = field(default_factory=Terminal)
    wait_gpus: float | None = None  # ``--wait-gpus``: seconds to queue for GPUs other runs lease (inf: no limit)

    def __post_init__(self) -> None:
        object.__setattr__(self, "preflight", Preflight(self.preflight))

    @classmethod
    def from_flags(cls, run: RunSettings, *, world_size: int, preflight: str = "quick", detach: bool = False,
                   time_limit: float | None = None, grace: float = protocol.GRACE, path_watch: bool | None = None,
                   on_path_loss: str | None = None, hang_timeout: float | None = None, on_hang: str | None = None,
                   max_restarts: int | None = None, min_nodes: int | None = None,
                   restart_backoff: float | None = None, wait_gpus: float | None = None,
                   sample_every: float | None = None, notify: Sequence[str] = (),
                   ranks: Collection[int] | None = None, quiet: bool = False, raw: bool = False,
                   fold: bool | None = None) -> LaunchRequest:
        """The request of the command line over the inventory's ``run`` settings: each flag given (not None) wins,
        ``--notify`` adds to ``run.notify``. Folding waits for copies only where a copy can come: more than one
        rank in the job, and more than one shown."""
        supervision = SupervisorSettings(
            grace=grace, timeout=time_limit, path_watch=run.path_watch if path_watch is None else path_watch,
            on_path_loss=on_path_loss or run.on_path_loss, hang_timeout=hang_timeout or run.hang_timeout,
            on_hang=on_hang or run.on_hang,
            sample_every=run.sample_every if sample_every is None else sample_every)
        restarts = RestartSettings(
            max_restarts=run.max_restarts if max_restarts is None else max_restarts,
            min_nodes=run.min_nodes if min_nodes is None else min_nodes,
            backoff=run.restart_backoff if restart_backoff is None else restart_backoff)
        shown = frozenset(ranks) if ranks is not None else None
        folds = (run.fold if fold is None else fold) and world_size > 1 and (shown is None or len(shown) > 1)
        return cls(supervision, restarts, preflight, detach, (*run.notify, *notify),
                   Terminal(shown, quiet, raw, folds), wait_gpus)
