"""How a supervised run behaves: heartbeats, stop and drain bounds, the watches, the time limit, the restarts.

One frozen value per run, made from the inventory's ``run`` settings and the command line
(:meth:`SupervisorSettings.for_run`) and spaced out for large runs (:meth:`SupervisorSettings.paced`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterrun.remote import protocol

if TYPE_CHECKING:  # standard library only at run time: the cluster supervisor of a detached run takes these settings
    from clusterrun.inventory.models import RunSettings

#: On a large run, at most about this many heartbeats, and CPU reports, reach clusterrun each second.
BEATS_PER_SECOND = 32.0
LOADS_PER_SECOND = 32 / 3  # 32 nodes report every 3 s, as given


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
    on_path_loss: str = "stop"  # or "warn": a dead data path is reported, the job goes on
    watch_interval: float = protocol.WATCH_INTERVAL  # seconds between two probes of one path
    watch_dead_after: float = protocol.WATCH_DEAD_AFTER  # seconds without an answer before a path is lost
    hang_timeout: float | None = None  # no output from any rank for this long: every rank's stack, a digest
    on_hang: str = "wait"  # or "stop": after the digest, stop the job
    load_every: float = 3.0  # seconds between the agents' CPU reports (stragglers); 0: none
    wait_gpus: float | None = None  # ``up --wait-gpus``: seconds to queue for leased GPUs (inf: no limit)
    sample_every: float = 1.0  # seconds between the nodes' samples of NICs, ranks and GPUs (0: none)

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

    @classmethod
    def for_run(cls, run: RunSettings, *, grace: float, timeout: float | None, path_watch: bool | None = None,
                on_path_loss: str | None = None, hang_timeout: float | None = None,
                on_hang: str | None = None, sample_every: float | None = None) -> SupervisorSettings:
        """The inventory's ``run`` settings, with each value given on the command line (not None) winning."""
        return cls(grace=grace, timeout=timeout, path_watch=run.path_watch if path_watch is None else path_watch,
                   on_path_loss=on_path_loss or run.on_path_loss, hang_timeout=hang_timeout or run.hang_timeout,
                   on_hang=on_hang or run.on_hang,
                   sample_every=run.sample_every if sample_every is None else sample_every)


@dataclass(frozen=True)
class RestartSettings:
    """``--max-restarts``, ``--min-nodes``, ``--restart-backoff`` (or the inventory's ``run`` section)."""

    max_restarts: int = 0
    min_nodes: int | None = None  # None: every node is needed
    backoff: float = 5.0  # seconds before the first restart; doubling, at most a minute

    @property
    def may_drop(self) -> bool:
        return self.min_nodes is not None
