"""Watching a running job: its data paths (:class:`DataPathWatch`, the orchestrator's side of
:mod:`clusterrun.remote.pathwatch`) and its silence (:class:`HangWatch`, every rank's stack when no rank has
printed anything for ``--hang-timeout`` seconds).

Pure logic, driven by the supervisor's loop: which node watches which (every node watches the node of
rank 0 and the next node in the ring, so every node is watched by at least one other and the master by
all), and, when paths are reported lost, which node is at fault. A dead NIC makes every path through
it fail, seen from both ends: after the first loss the verdict waits ``settle`` seconds for the others,
then blames the node that appears in the most lost paths. On a tie: a node clusterrun cannot hear either (it is
down, not just its data path), then a node with no path seen to work, then the one that reported the most losses
(its own paths failed). That rule, :func:`at_fault`, is also the check before the start's
(:mod:`clusterrun.launch.pathcheck`). The verdict names the node, its NIC, the peer it stopped reaching and when.
:class:`StragglerWatch` says who the others wait for (the rule: :mod:`clusterrun.runs.stragglers`).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterrun.facts.flight import behind
from clusterrun.facts.flight import digest as flight_digest
from clusterrun.facts.stacks import digest, odd_ones
from clusterrun.launch.settings import OnHang
from clusterrun.remote import answers, protocol
from clusterrun.runs.record import HUNG, Failure
from clusterrun.runs.stragglers import StragglerJudge

SETTLE = 2.0  # seconds to gather the other ends' reports of a failure before naming a node


#: A path between two nodes: (the node that tried, the node it tried to reach).
Link = tuple[str, str]


def at_fault(lost: Iterable[Link], order: Sequence[str], silent: Collection[str] = (),
             working: Iterable[Link] = ()) -> list[str]:
    """The nodes most likely at fault given the ``lost`` paths, for the watch and for the check before the start:
    best first (by node rank in ``order`` among equals); more than one when the evidence cannot tell them apart,
    none when nothing was lost. ``silent``: nodes clusterrun itself has not heard from lately; ``working``: paths
    seen to work (a node with one is not the dead end of the others)."""
    lost = list(lost)
    if not lost:
        return []
    count = Counter(n for path in lost for n in path)
    top = max(count.values())
    candidates = [n for n, c in count.items() if c == top]
    candidates = [n for n in candidates if n in silent] or candidates
    fine = {n for path in working for n in path}
    candidates = [n for n in candidates if n not in fine] or candidates
    reporters = Counter(path[0] for path in lost)
    best = max(reporters[n] for n in candidates)
    rank = {name: i for i, name in enumerate(order)}
    return sorted((n for n in candidates if reporters[n] == best), key=lambda n: (rank.get(n, len(rank)), n))


@dataclass(frozen=True)
class Endpoint:
    node: str
    address: str
    nic: str | None


@dataclass(frozen=True)
class PathLoss:
    node: str  # the node that reported it
    nic: str | None
    peer: str
    peer_address: str
    since: float  # wall time of the last answer (of the watch's start, when it never answered)
    answered: bool = True  # False: the peer never answered at all


@dataclass(frozen=True)
class Verdict:
    node: str  # the node at fault
    loss: PathLoss  # the reported path that names it best
    paths: tuple[PathLoss, ...]
    also: tuple[str, ...] = ()  # nodes just as likely at fault (two nodes that lost each other)

    def detail(self) -> str:
        """What happened, without the node's name in front."""
        when = time.strftime("%H:%M:%S", time.localtime(self.loss.since))
        nic = self.loss.nic or "its data NIC"
        lost = f"stopped reaching {{}} at {when}" if self.loss.answered else "never reached {}"
        if self.also:
            return (f"it and {' and '.join(self.also)} {lost.format('each other')} on the data network ({nic}); "
                    "the job is waiting on it (with two nodes, which end is at fault cannot be told: `clusterrun "
                    "doctor` checks each)")
        if self.loss.node == self.node:
            return (f"{nic} {lost.format(f'{self.loss.peer} ({self.loss.peer_address})')}; the job is waiting on it")
        return (f"stopped answering on its data address ({self.loss.peer_address}) at {when}, as seen from "
                f"{self.loss.node} ({nic}); the job is waiting on it")

    def describe(self) -> str:
        return f"{self.node}: {self.detail()}"


@dataclass
class PathWatchState:
    """What the watch knows: each node's watch port, the losses not judged yet, the verdicts given."""

    endpoints: dict[str, Endpoint]  # node -> where its watch listens (address and NIC)
    order: Sequence[str]  # node names by node rank
    settle: float = SETTLE
    ports: dict[str, int] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # node -> why it cannot watch
    pending: list[PathLoss] = field(default_factory=list)
    due: float | None = None  # monotonic time of the next verdict
    blamed: set[str] = field(default_factory=set)

    def targets_of(self, node: str) -> list[dict[str, Any]]:
        """The node of rank 0 and the next node in the ring (those whose watch is up), for ``node`` to probe."""
        index = list(self.order).index(node)
        names = [self.order[0], self.order[(index + 1) % len(self.order)]]
        out = []
        for name in dict.fromkeys(names):
            if name != node and name in self.ports:
                out.append({"node": name, "address": self.endpoints[name].address, "port": self.ports[name]})
        return out

    def ready(self) -> bool:
        """Every node has said whether its watch is up: time to hand out targets."""
        return len(self.ports) + len(self.unavailable) == len(self.order)

    def lost(self, loss: PathLoss, now: float) -> None:
        self.pending.append(loss)
        if self.due is None:
            self.due = now + self.settle

    def verdict(self, now: float, ended: set[str], silent: Collection[str] = ()) -> Verdict | None:
        """The node at fault once the settle time has passed (None before, or when every loss involves a node
        whose job already ended: its watch is gone, not its path). ``silent``: nodes clusterrun itself has not
        heard from lately (a node that fell off every network cannot report its own losses)."""
        if self.due is None or now < self.due:
            return None
        # A loss with an end already blamed or already finished is explained (its watch is gone, not its path).
        gone = ended | self.blamed
        losses = [p for p in self.pending if p.node not in gone and p.peer not in gone]
        self.pending, self.due = [], None
        if not losses:
            return None
        tied = at_fault(((p.node, p.peer) for p in losses), self.order, silent)
        culprit = tied[0]
        self.blamed.update(tied)
        # Its own path to rank 0's node first (every rank depends on it), then by node rank: the same words each time.
        order = list(self.order)
        own = sorted((p for p in losses if p.node == culprit), key=lambda p: order.index(p.peer) if p.peer in order
                     else len(order))
        return Verdict(culprit, own[0] if own else next(p for p in losses if p.peer == culprit), tuple(losses),
                       also=tuple(tied[1:]))


class DataPathWatch:
    """The supervisor's side of the watch: hands out targets, turns ``path`` events into verdicts.

    ``send(node, line)`` writes a command to a node's agent; ``say(text)`` tells the user; ``record(event)`` adds
    to the run's events (time, node, kind, text); ``lost(verdict)`` is called once per node found at fault (the
    supervisor stops the job, or only warns).
    """

    def __init__(self, state: PathWatchState, send: Callable[[str, str], object], say: Callable[[str], None],
                 lost: Callable[[Verdict], None], record: Callable[[dict[str, Any]], None],
                 start_wait: float = 15.0) -> None:
        self.state = state
        self.send, self.say, self.lost, self.record = send, say, lost, record
        self.started = time.monotonic()
        self.start_wait = start_wait  # after this, targets go out even if a node never said where it listens
        self.sent = False

    def on_watching(self, node: str, event: answers.Watching) -> None:
        if event.error:
            self.state.unavailable[node] = event.error
            self.say(f"{node}: the data-path watch is off there: {event.error}")
        elif event.port:
            self.state.ports[node] = event.port

    def on_path(self, node: str, event: answers.Path, now: float, stopping: bool,
                ended: Collection[str] = ()) -> None:
        """A node's report that one of its paths was lost or is back. Not one of the run's events when the job is
        stopping, or when either end's job is over (a node that has ended no longer answers: that is no loss)."""
        peer = event.peer
        if stopping or node in ended or peer in ended:
            return
        address, nic = event.address, event.nic
        if event.state == "lost":
            self.state.lost(PathLoss(node, nic, peer, address, event.since or time.time(), event.answered), now)
            self.record({"time": time.time(), "node": node, "kind": "path-lost",
                                "text": f"{nic or 'data NIC'} gets no answer from {peer} ({address})"})
        else:
            self.record({"time": time.time(), "node": node, "kind": "path-ok",
                                "text": f"{nic or 'data NIC'} reaches {peer} ({address}) again"})
            if peer in self.state.blamed or node in self.state.blamed:
                self.say(f"{node}: {nic or 'its data NIC'} reaches {peer} ({address}) again")

    def tick(self, now: float, ended: set[str], silent: Collection[str] = ()) -> None:
        if not self.sent and (self.state.ready() or now - self.started > self.start_wait):
            self.sent = True
            for node in self.state.ports:
                targets = self.state.targets_of(node)
                if targets:
                    self.send(node, f"{protocol.WATCH} {json.dumps(targets, separators=(',', ':'))}\n")
        verdict = self.state.verdict(now, ended, silent)
        if verdict is not None:
            self.record({"time": time.time(), "node": verdict.node, "kind": "path-verdict",
                                "text": verdict.describe()})
            self.lost(verdict)


class HangWatch:
    """``--hang-timeout``: when no rank has printed anything for that long, every rank's stack and its recent
    collectives (torch's flight recorder), and a digest of both.

    ``send_all(line)`` writes a command to every running agent; ``save(relpath, data)`` keeps a file under the
    run directory (runs/<id>/<node>/stack-rank<R>.txt, flight-rank<R>.json) and returns where; ``say``,
    ``record`` as for :class:`DataPathWatch`; ``stop(failure)`` is called with ``OnHang.stop`` once the
    digest is out: the failure is the rank the evidence names, on its node (``master``, rank 0's node, when the
    evidence names no one rank).
    """

    COLLECT_FOR = 30.0  # seconds to wait for every node's dumps

    def __init__(self, timeout: float, on_hang: OnHang, send_all: Callable[[str], object],
                 save: Callable[[str, bytes], str], say: Callable[[str], None],
                 record: Callable[[dict[str, Any]], None], stop: Callable[[Failure], None], master: str) -> None:
        self.timeout, self.on_hang = timeout, on_hang
        self.send_all, self.save, self.say, self.record, self.stop = send_all, save, say, record, stop
        self.master = master
        self.last_output = time.monotonic()
        self.collecting_since: float | None = None
        self.diagnosed_at: float | None = None  # this silence was diagnosed (a reminder follows every timeout)
        self.dumps: dict[int, str] = {}
        self.flights: dict[int, bytes] = {}
        self.done: set[str] = set()
        self.where: list[str] = []
        self.timeout_dumps: list[str] = []
        self.nodes: dict[int, str] = {}  # rank -> its node, from the dumps

    def output(self, now: float) -> None:
        self.last_output = now
        if self.diagnosed_at is not None and self.collecting_since is None:
            self.diagnosed_at = None  # output again: a new silence may be diagnosed again
            self.say("the job prints again")

    def on_stack(self, node: str, event: answers.Stack, payload: bytes) -> None:
        rank, how = event.rank, event.how
        self.nodes[rank] = node
        text = payload.decode("utf-8", errors="replace")
        self.dumps[rank] = text if how != "none" else ""
        header = f"# rank {rank} on {node}, taken with {how} at {time.strftime('%H:%M:%S')}\n"
        self.where.append(self.save(f"{node}/stack-rank{rank}.txt", header.encode() + payload))

    def on_flight(self, node: str, event: answers.Flight, payload: bytes) -> None:
        """One rank's flight recorder: asked for (JSON, kept for the digest) or dumped by torch's watchdog when
        a collective timed out (torch's own format, for ``torchfrtrace``)."""
        rank = event.rank
        self.nodes.setdefault(rank, node)
        if event.format == "timeout":
            if payload:
                self.timeout_dumps.append(self.save(f"flight/nccl-rank{rank}", payload))
            return
        self.flights[rank] = payload or json.dumps({"error": event.why or "no dump"}).encode()
        if payload:
            self.save(f"{node}/flight-rank{rank}.json", payload)

    def timeout_dumps_note(self) -> str | None:
        """What to say about the dumps torch's watchdog wrote itself, once the run is over."""
        if not self.timeout_dumps:
            return None
        folder = str(Path(self.timeout_dumps[0]).parent)
        return (f"a collective timed out and torch dumped its flight recorder on {len(self.timeout_dumps)} "
                f"rank(s): read them with `torchfrtrace {folder} -p nccl-rank`")

    def on_done(self, node: str) -> None:
        self.done.add(node)

    def tick(self, now: float, running: set[str], stopping: bool) -> None:
        silent = now - self.last_output
        if stopping:
            return
        if self.collecting_since is None and self.diagnosed_at is None and silent >= self.timeout:
            self.collecting_since, self.dumps, self.flights, self.done, self.where = now, {}, {}, set(), []
            self.say(f"no rank has printed anything for {silent:.0f}s: taking every rank's stack")
            self.record({"time": time.time(), "node": "-", "kind": "hang",
                         "text": f"no output from any rank for {silent:.0f}s"})
            self.send_all(f"{protocol.STACKS}\n")
            return
        if self.collecting_since is not None:
            if not (running <= self.done) and now - self.collecting_since < self.COLLECT_FOR:
                return
            self._digest(now, silent)
            return
        if self.diagnosed_at is not None and self.on_hang is OnHang.wait and now - self.diagnosed_at >= self.timeout:
            self.diagnosed_at = now
            self.say(f"still no output for {silent:.0f}s (--on-hang wait); the stacks above are where the ranks "
                     "were; Ctrl-C stops the job")

    def _digest(self, now: float, silent: float) -> None:
        # A rank that printed while the stacks were being taken ended this silence (a job whose workers came up
        # just after it was judged): the digest still shows where the ranks were, but the job is not stopped, and
        # the next silence is diagnosed again.
        printed = self.collecting_since is not None and self.last_output > self.collecting_since
        self.collecting_since, self.diagnosed_at = None, (None if printed else now)
        lines = digest(self.dumps) if self.dumps else ["no rank's stack could be taken (no worker found)"]
        collectives = flight_digest(self.flights, set(self.dumps)) if self.flights else []
        where = sorted({str(Path(p).parent) for p in self.where})
        self.say("where the ranks are:\n" + "\n".join(f"    {line}" for line in lines)
                 + ("\n  in torch.distributed (flight recorder):\n" + "\n".join(f"    {line}" for line in collectives)
                    if collectives else "")
                 + (f"\n  stacks in {', '.join(where)}/stack-rank<R>.txt"
                    + (" (collectives: flight-rank<R>.json)" if self.flights else "") if where else ""))
        self.record({"time": time.time(), "node": "-", "kind": "hang-stacks", "text": "; ".join(lines)})
        if collectives:
            self.record({"time": time.time(), "node": "-", "kind": "hang-collectives", "text": "; ".join(collectives)})
        if printed:
            self.say("the job prints again")
            return
        if self.on_hang is OnHang.stop:
            rank = self.suspect()
            why = (f"no rank printed anything for {silent:.0f}s (--hang-timeout {self.timeout:g}); "
                   + "; ".join(line.split("   <- ")[0] for line in lines + collectives))
            node = self.nodes.get(rank) if rank is not None else None
            self.stop(Failure(node or self.master, rank if node else None, 1, None, f"{HUNG}{why}"))

    def suspect(self) -> int | None:
        """The one rank the evidence names: the odd one out of the stacks and the rank the others wait for in the
        flight recorder (the rank both name, when both name some), else None (no evidence, or more than one)."""
        odd = set(odd_ones(self.dumps))
        late = set(behind(self.flights, set(self.dumps))) if self.flights else set()
        named = (odd & late) if odd and late else (odd or late)
        return named.pop() if len(named) == 1 else None


class StragglerWatch:
    """The straggler rule (:mod:`clusterrun.runs.stragglers`: the rank that keeps working while the others wait, by
    CPU share and, where there are GPUs, by GPU utilisation and power) in the supervisor: fed the agents' ``load``
    reports and the nodes' samples; each verdict said in one line, kept as an event of the run (kind
    ``straggler``) and sent to ``--notify``. Nothing else is done: the job goes on."""

    def __init__(self, say: Callable[[str], None], record: Callable[[dict[str, Any]], None],
                 judge: StragglerJudge | None = None,
                 notify: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.say, self.record, self.notify = say, record, notify
        self.judge = judge or StragglerJudge()

    @classmethod
    def for_plan(cls, plan: Any, say: Callable[[str], None], record: Callable[[dict[str, Any]], None],
                 notifier: Any = None) -> StragglerWatch | None:
        """The watch of a :class:`~clusterrun.planning.planfile.LaunchPlan` (None: one rank, no one to wait for). Local rank
        i uses the i-th of its node's GPUs; ``notifier``: a :class:`~clusterrun.notify.Notifier`, or None."""
        if plan.world_size < 2:
            return None
        gpus = {n.name: {str(g): n.rank_offset + i for i, g in enumerate(n.gpus[:n.nproc_per_node])}
                for n in plan.nodes}
        notify = None
        if notifier is not None:
            def notify(text: str, fields: dict[str, Any]) -> None:
                notifier.send("straggler", f"clusterrun: run {plan.run_id}: {text}", run_id=plan.run_id, **fields)
        return cls(say, record, StragglerJudge(gpus), notify)

    def on_event(self, node: str, event: answers.Answer) -> None:
        """A ``load`` report or a ``sample`` of ``node``, as decoded (the judge reads them as the mappings the
        agent sent: runs/stragglers.py is shared with what reads a record's series)."""
        found = (self.judge.on_load(node, {"cpu": event.cpu, "time": event.time}) if isinstance(event, answers.Load)
                 else self.judge.on_sample(node, event._asdict()) if isinstance(event, answers.Sample) else [])
        for verdict in found:
            self.say(verdict.message())
            self.record(verdict.record_event())
            if self.notify is not None:
                self.notify(verdict.message(), {"node": verdict.node, **verdict.fields()})
