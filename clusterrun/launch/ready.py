"""The ready check (the first step of `up`): every node in parallel proves it can run the job, and gets the files it lacks.

It is the first thing the node's agent does (one program per node: :mod:`clusterrun.agents.link`):
through the node's own python it proves the interpreter exists and has torch with torchrun (found, not
imported: ``clusterrun doctor`` imports it), creates the run directory, leases the master port on rank 0
(the user's, proven free, or a free one it chooses when the user set none), reports the node's NICs and GPUs
(and which of them other runs lease), and which staged files the node's content cache lacks. Missing
files are then copied (only those: a second `up` of the same script copies nothing) and the agent places
them in the run directory when the job starts. If any node fails, :class:`StartError` lists every problem,
every agent is dropped, and nothing is started anywhere.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from clusterrun.agents.link import AgentLink, open_link
from clusterrun.agents.spec import check_spec
from clusterrun.errors import ClusterrunError, NodeNotReady, NoTorch, PythonNotFound, StartError
from clusterrun.facts.node import ProbedNode
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.planning.plan import LaunchPlan, NodePlan
from clusterrun.remote import protocol, session
from clusterrun.runs.timeline import Timeline
from clusterrun.transport.base import Transport
from clusterrun.transport.early import EarlyConnections
from clusterrun.transport.fanout import on_every_node

#: Content-addressed copies of staged files on each node (by sha256).
REMOTE_CACHE = "~/.clusterrun/cache"
PREFLIGHT_TIMEOUT = 60.0

@dataclass(frozen=True)
class StagedFile:
    local: Path
    digest: str
    dest: str  # where the node agent puts it (in the run directory)
    kind: str = "file"  # or "tree": a tar archive the agent unpacks into dest


@dataclass
class NodeReady(ProbedNode):
    """A node that passed the ready check: its facts, what was staged there, and its agent waiting for `go`."""

    copied: list[str] = field(default_factory=list)
    stage: list[tuple[str, str, str]] = field(default_factory=list)  # (cache path, destination, kind)
    link: AgentLink | None = field(default=None, repr=False, compare=False)  # the node's agent, waiting for `go`
    image_id: str | None = None  # the container image's id on the node (None: no container)
    pulled: bool = False  # the node pulled the image for this run


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "runs", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_archives: dict[str, Path] = {}


def sync_archive(directory: str) -> Path:
    """A reproducible tar of ``directory`` (sorted, no times or owners): same content, same hash."""
    if directory in _archives:
        return _archives[directory]
    import tarfile
    import tempfile

    root = Path(directory)
    fd, name = tempfile.mkstemp(prefix="clusterrun-sync-", suffix=".tar")
    os.close(fd)
    with tarfile.open(name, "w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if set(rel.parts) & _SKIP_DIRS or path.is_symlink() or not path.is_file():
                continue
            info = archive.gettarinfo(str(path), arcname=str(rel))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(path, "rb") as fh:
                archive.addfile(info, fh)
    _archives[directory] = Path(name)
    return _archives[directory]


def remove_archives() -> None:
    """Delete the temporary --sync archives of this process."""
    while _archives:
        _, path = _archives.popitem()
        path.unlink(missing_ok=True)


def files_to_stage(plan: LaunchPlan, node: NodePlan) -> list[StagedFile]:
    """The script (or the whole --sync directory), when this node runs a copy in its run directory."""
    if node.transport is TransportKind.local or plan.job.module or node.script == plan.job.script:
        return []
    staged = []
    code_dir = posixpath.join(node.run_dir, "code")
    if plan.job.sync_dir:
        archive = sync_archive(plan.job.sync_dir)
        staged.append(StagedFile(archive, _sha256(archive), code_dir, "tree"))
    local = Path(plan.job.local_cwd, plan.job.script)
    if not plan.job.sync_dir or not str(local.resolve()).startswith(str(Path(plan.job.sync_dir).resolve()) + os.sep):
        staged.append(StagedFile(local, _sha256(local), node.script))
    return staged


def _no_python(link: AgentLink) -> bool:
    """The agent could not even start: the shell found no such interpreter (exit 127)."""
    return link.stream.wait(0.5) == 127 or any("not found" in line for line in link.stderr_text().splitlines()[-3:])


def _ask(plan: LaunchPlan, node: NodePlan, transport: Transport, staged: list[StagedFile],
         timeline: Timeline, early: EarlyConnections | None) -> AgentLink:
    """Start the node's agent and send it the check (the answer is waited for later, with every node's)."""
    master = node.node_rank == 0
    spec = check_spec(node.run_dir, cache=REMOTE_CACHE, hashes=[f.digest for f in staged],
                      port=plan.master_port if master and not plan.choose_port else None,
                      choose_port=master and plan.choose_port, run_id=plan.run_id, node=node, warm=True)
    if early is not None and early.has(node.name):  # connecting since `up` had the plan
        began, connected = early.wait(node.name, PREFLIGHT_TIMEOUT)
        timeline.begin(node.name, "connect", began)
    else:
        timeline.begin(node.name, "connect")
        transport.connect()
        connected = time.time()
    timeline.begin(node.name, "agent", timeline.end(node.name, "connect", connected))
    link = open_link(transport, node)
    link.check(spec)  # a closed stream shows as the end, when the answer is read
    return link


def _answer(node: NodePlan, link: AgentLink, transport: Transport, deadline: float,
            timeline: Timeline, progress: Callable[[str, str], None] | None = None) -> tuple[NodeReady, set[str]]:
    """What the node reported, with the staged files its cache lacks; or the error that says why the node cannot
    run the job."""
    try:
        said = None if progress is None else (
            lambda event: progress(node.name, f"pulling {event.get('image')} ({event.get('seconds')}s so far)"))
        answer = link.answer((session.READY, protocol.ERROR), deadline, said)
        # The answer arrived when its bytes did (the node says nothing more until asked), not when it was read here.
        received = time.time() - (time.monotonic() - link.heard)
        sent = timeline.started(node.name, "agent") or received
        running = timeline.node_clock(node.name, sent, answer.get("time"), received)
        timeline.begin(node.name, "ready", timeline.end(node.name, "agent", running))
        timeline.end(node.name, "ready", received)
    except ClusterrunError as exc:
        if _no_python(link):
            raise PythonNotFound(node.name, f"python {node.python!r} not found on the node; give an interpreter "
                                            "that exists there with --python PATH or `python` in the inventory "
                                            "(an absolute path is safest)") from None
        raise NodeNotReady(node.name, f"the node check failed: {getattr(exc, 'reason', exc)}") from None
    if answer.get("ev") == protocol.ERROR:  # the node refused the check's spec
        raise NodeNotReady(node.name, f"the node check failed: {answer.get('text')}")
    report = answer["report"]
    if report["problems"]:
        kind = NoTorch if report.get("no_torch") else NodeNotReady
        raise kind(node.name, "; ".join(report["problems"]))
    found = NodeReady(node.name, report["python"], report.get("torch", ""), net=report.get("net"),
                      ssh_address=transport.peer_address(), gpus=report.get("gpus"), leases=report.get("leases"),
                      master_port=report.get("master_port"), topology_addr=report.get("topology_addr"),
                      gpu=report.get("gpu"), link=link)
    found.image_id, found.pulled = report.get("image_id"), bool(report.get("pulled"))
    return found, set(report["missing"])


def _stage(ready: NodeReady, transport: Transport, staged: list[StagedFile], missing: set[str],
           timeline: Timeline) -> NodeReady:
    timeline.begin(ready.node, "staging")
    copied = 0
    for f in staged:
        cached = posixpath.join(REMOTE_CACHE, f.digest)
        if f.digest in missing:
            transport.put(f.local, cached)
            ready.copied.append(str(f.local))
            copied += f.local.stat().st_size
        ready.stage.append((cached, f.dest, f.kind))
    timeline.end(ready.node, "staging", bytes=copied)
    return ready


def check_ready(plan: LaunchPlan, transports: Mapping[str, Transport], timeline: Timeline | None = None,
                early: EarlyConnections | None = None,
                progress: Callable[[str, str], None] | None = None) -> dict[str, NodeReady]:
    """Start every node's agent, check and stage every node. Raises :class:`StartError` naming every node that
    failed (after dropping every agent: nothing waits on a node for a job that will not come). Each step's time
    goes to ``timeline`` (connect, agent, ready, staging); the connections of ``early`` are already under way.
    ``progress`` hears (node, what) while a node pulls its image.

    Three steps, so that no thread waits on a node's answer: connect and start the agents (in parallel), read
    the answers as they come (each node's agent has its own reader), copy what is missing (in parallel)."""
    timeline = timeline or Timeline()
    staged = {node.name: files_to_stage(plan, node) for node in plan.nodes}
    nodes = {node.name: node for node in plan.nodes}
    links, problems = on_every_node(plan.nodes, lambda n: n.name,
                                    lambda n: _ask(plan, n, transports[n.name], staged[n.name], timeline, early), "preflight")
    deadline = time.monotonic() + PREFLIGHT_TIMEOUT + (_image_bound() if any(n.container for n in plan.nodes) else 0)
    ready: dict[str, NodeReady] = {}
    missing: dict[str, set[str]] = {}
    for name, link in links.items():
        try:
            ready[name], missing[name] = _answer(nodes[name], link, transports[name], deadline, timeline, progress)
        except ClusterrunError as exc:
            problems[name] = getattr(exc, "reason", str(exc))
            link.abort()
    if not problems:
        problems.update(image_problems(plan, ready))
    if not problems:
        _, copy_problems = on_every_node(
            [nodes[name] for name in ready], lambda n: n.name,
            lambda n: _stage(ready[n.name], transports[n.name], staged[n.name], missing[n.name], timeline), "copy")
        problems.update(copy_problems)
    if problems:
        drop(ready)
        raise StartError({n.name: problems[n.name] for n in plan.nodes if n.name in problems},
                         hint="fix the above (`clusterrun plan` shows what each node would run); no node was started")
    return ready


def _image_bound() -> float:
    """Seconds a node's image check may add: each of its steps is bounded on the node (containers.py)."""
    from clusterrun.remote import containers

    return containers.PULL_TIMEOUT + containers.TORCH_TIMEOUT + 3 * containers.ASK_TIMEOUT


def image_problems(plan: LaunchPlan, ready: Mapping[str, NodeReady]) -> dict[str, str]:
    """Per node, why its image is not the one the others run: one tag may name different images on different
    nodes (pulled on different days), and ranks of different builds fail in ways that name neither."""
    by_image: dict[str, dict[str, list[str]]] = {}
    for node in plan.nodes:
        got = ready.get(node.name)
        if node.container is not None and got is not None and got.image_id:
            by_image.setdefault(node.container.image, {}).setdefault(got.image_id, []).append(node.name)
    problems: dict[str, str] = {}
    for image, ids in by_image.items():
        if len(ids) < 2:
            continue
        common_id, common = max(ids.items(), key=lambda item: len(item[1]))
        for image_id, names in ids.items():
            if image_id == common_id:
                continue
            for name in names:
                problems[name] = (f"the image {image} is {_short_id(image_id)} here, but "
                                  f"{_short_id(common_id)} on {', '.join(common)}; pull the same image on "
                                  "every node (or name it by digest)")
    return problems


def image_lines(plan: LaunchPlan, ready: Mapping[str, NodeReady]) -> list[str]:
    """What the nodes run in: per image, its id, the torch in it and the nodes that had to pull it."""
    lines = []
    for image in dict.fromkeys(n.container.image for n in plan.nodes if n.container is not None):
        nodes = [n for n in plan.nodes if n.container is not None and n.container.image == image and n.name in ready]
        if not nodes:
            continue
        ids = {ready[n.name].image_id for n in nodes if ready[n.name].image_id}
        torch = sorted({ready[n.name].torch_version for n in nodes if ready[n.name].torch_version})
        pulled = [n.name for n in nodes if ready[n.name].pulled]
        lines.append(f"image {image} ({nodes[0].container.runtime.value}"
                     + (f", {_short_id(next(iter(ids)))}" if len(ids) == 1 else "")
                     + f") on {len(nodes)} node(s), torch {', '.join(torch) or '?'}"
                     + (f"; pulled on {', '.join(pulled)}" if pulled else ""))
    return lines


def _short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def drop(ready: Mapping[str, NodeReady]) -> None:
    """End the agents of ``ready`` that were never told to start (their job will not come)."""
    for r in ready.values():
        if r.link is not None:
            r.link.abort()
