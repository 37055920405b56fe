"""Where the nodes come from: an INVENTORY file or a one-liner (``--ips``, ``--hostfile``, ``--slurm``).

One-liner sources build the same :class:`Inventory` a file would, validated by the same
models, so the rest of clusterrun never knows the difference. ``--nodes`` then narrows any
source to a subset. Nothing here touches the network; only the named files are read.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from clusterrun.errors import UsageError
from clusterrun.inventory.hostfile import parse_hostfile
from clusterrun.inventory.hostlist import compress_hostlist, expand_hostlist
from clusterrun.inventory.hostspec import normalize_host, parse_gpu_list, parse_ips
from clusterrun.inventory.models import Inventory
from clusterrun.inventory.textfile import read_text_file
from clusterrun.inventory.types import brief_repr, format_path
from clusterrun.inventory.yaml_source import load_inventory

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_NAME_BAD_CHARS_RE = re.compile(r"[^A-Za-z0-9._-]")
_TERM_SPLIT_RE = re.compile(r",(?![^\[]*\])")  # commas outside [...]
_NAME_MAX = 63
#: One-liner-only flags, and where the same setting lives in an inventory file.
_FILE_KEYS = {"--gpus": "each node's gpus", "--ssh-user": "defaults.ssh.user", "--python": "defaults.python",
              "--data-nic": "network.data", "--ssh-config": "defaults.ssh.config_file",
              "--transport": "defaults.transport"}
#: The one-liner transports (``local`` exists only in inventory files).
TRANSPORTS = ("ssh", "srun")
#: Inventory paths (list indices left out) whose values come from these flags.
_FLAG_OF_PATH = {("defaults", "ssh", "user"): "--ssh-user", ("defaults", "python"): "--python",
                 ("defaults", "nproc_per_node"): "--nproc-per-node", ("network", "data"): "--data-nic",
                 ("nodes", "gpus"): "--gpus"}


@dataclass(frozen=True)
class HostSource:
    """The node source flags of one command; exactly one of the first four must be set."""

    inventory: Path | None = None  # INVENTORY YAML
    ips: str | None = None  # --ips 10.0.0.1,gpu-02:2222
    hostfile: Path | None = None  # --hostfile FILE (DeepSpeed/MPI: "worker-1 slots=4")
    slurm: str | None = None  # --slurm [NODELIST]; "" means: take SLURM_JOB_NODELIST from the environment
    gpus: str | None = None  # --gpus 0,1,2,3 (same on every node)
    nproc_per_node: int | None = None  # --nproc-per-node N
    ssh_user: str | None = None  # --ssh-user
    ssh_config: Path | None = None  # --ssh-config FILE (instead of ~/.ssh/config)
    python: str | None = None  # --python PATH on the nodes
    data_nic: str | None = None  # --data-nic NAME or CIDR -> network.data
    nodes: str | None = None  # --nodes PATTERN: subset by name glob, Slurm hostlist, or label=VALUE
    transport: str | None = None  # --transport ssh|srun; None: srun for --slurm inside an allocation, else ssh
    local: bool = False  # SCRIPT alone (no INVENTORY, --ips, --hostfile or --slurm): this machine, no SSH


def load_cluster(src: HostSource, environ: Mapping[str, str] = os.environ) -> Inventory:
    """Build the validated inventory ``src`` names, narrowed by ``--nodes`` when given.

    * INVENTORY: the file as :func:`load_inventory` reads it. ``--gpus``, ``--ssh-user``,
      ``--python`` and ``--data-nic`` are refused (set them in the file); ``--nproc-per-node``
      is left out of the inventory, since the job's value already wins over the file when planning.
    * ``--ips`` / ``--hostfile`` / ``--slurm``: one node per host, named after the host (a host
      that is no valid node name, like an IPv6 address, gets a derived name; ``host`` keeps it
      as given), with ``host:port`` as the node's ssh port, ``--gpus`` on every node,
      ``--nproc-per-node`` as ``defaults.nproc_per_node``, ``--ssh-user``/``--python`` as
      ``defaults.ssh.user``/``defaults.python``, ``--data-nic`` as ``network.data``, no NICs (they
      are probed on the nodes) and ``--transport`` as ``defaults.transport``: without it ssh, except
      for ``--slurm`` inside an allocation (``SLURM_JOB_ID`` in ``environ``), where it is srun
      (``--ssh-user`` and ``--ssh-config`` are then refused). A hostfile's ``slots=N`` becomes that node's
      ``nproc_per_node`` unless ``--nproc-per-node`` is given, which then wins for every node;
      ``max_slots`` is not used. ``--slurm ""`` reads ``SLURM_JOB_NODELIST`` from ``environ``.

    Raises :class:`UsageError` naming the flag (conflicting or missing sources, bad values,
    a host listed twice, a ``--nodes`` term that matches nothing) and :class:`InventoryError`
    naming ``file:line`` for the inventory file or hostfile.
    """
    inv, _ = _load_all(src, environ)
    return inv if src.nodes is None else select_nodes(inv, src.nodes)


def describe(src: HostSource, environ: Mapping[str, str] = os.environ) -> str:
    """A short description for messages: ``'--ips: 2 nodes'``, ``'cluster.yaml: 4 nodes (--nodes ib0[1-2]: 2)'``.

    Loads the source like :func:`load_cluster` and raises the same errors.
    """
    inv, label = _load_all(src, environ)
    text = f"{label}: {len(inv.nodes)} node{'' if len(inv.nodes) == 1 else 's'}"
    if src.nodes is not None:
        text += f" (--nodes {src.nodes}: {len(select_nodes(inv, src.nodes).nodes)})"
    return text


def select_nodes(inv: Inventory, pattern: str, flag: str = "--nodes") -> Inventory:
    """Keep the nodes ``pattern`` selects, in inventory order.

    ``pattern`` is comma-separated terms (commas inside ``[...]`` belong to the term), their union:
    ``label=VALUE`` selects nodes whose labels contain VALUE; a term with ``[`` and no ``*`` or
    ``?`` is a Slurm hostlist (``ib0[1-2]``) whose every name must be a node; anything else is a
    case-sensitive glob on node names (``gpu*``, ``node?``, or just a name).
    All other fields are kept, except that when nodes were removed every ``node_rank`` pin is
    cleared (the remaining pins would no longer be 0..n-1); ranks then follow inventory order.

    Raises :class:`UsageError` naming ``flag`` for an empty or malformed term or a term that
    selects no node, listing the node names and labels there are.
    """
    names = [n.name for n in inv.nodes]
    chosen: set[str] = set()
    for raw in _TERM_SPLIT_RE.split(pattern):
        term = raw.strip()
        if not term:
            raise UsageError(f"{flag}: empty term in {brief_repr(pattern)}; separate names, globs or label=VALUE with single "
                             f"commas, like {flag} 'gpu*,label=rack1'")
        key, sep, value = term.partition("=")
        if sep:
            if key.strip() != "label" or not value.strip():
                raise UsageError(f"{flag}: {brief_repr(term)} is not a selector; to select by label write label=VALUE, "
                                 "like label=rack1")
            hits = {n.name for n in inv.nodes if value.strip() in n.labels}
        elif "[" in term and not any(c in term for c in "*?"):
            wanted = expand_hostlist(term, flag)
            unknown = [w for w in wanted if w not in names]
            if unknown:
                verb = "is" if len(unknown) == 1 else "are"
                shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
                raise _no_match(inv, flag, f"{shown} (from {brief_repr(term)}) {verb} not in the nodes")
            hits = set(wanted)
        else:
            hits = {name for name in names if fnmatchcase(name, term)}
        if not hits:
            raise _no_match(inv, flag, f"{brief_repr(term)} selects no node")
        chosen |= hits
    if len(chosen) == len(names):
        return inv
    kept = [n if n.node_rank is None else n.model_copy(update={"node_rank": None})
            for n in inv.nodes if n.name in chosen]
    return Inventory(version=inv.version, defaults=inv.defaults, network=inv.network, nodes=kept)


def _load_all(src: HostSource, environ: Mapping[str, str]) -> tuple[Inventory, str]:
    """The whole inventory of ``src`` (before ``--nodes``) and a label for it."""
    given = [flag for flag, value in (("INVENTORY", src.inventory), ("--ips", src.ips),
                                       ("--hostfile", src.hostfile), ("--slurm", src.slurm)) if value is not None]
    if src.local and not given:
        return _this_machine(src), "this machine"
    if not given:
        raise UsageError("no nodes given: pass an INVENTORY file, or --ips HOSTS, --hostfile FILE or "
                         "--slurm [NODELIST]")
    if len(given) > 1:
        named = [f"INVENTORY ({src.inventory})" if g == "INVENTORY" else g for g in given]
        raise UsageError(f"{', '.join(named[:-1])} and {named[-1]} {'both' if len(named) == 2 else 'all'} name "
                         "the nodes; give exactly one of INVENTORY, --ips, --hostfile or --slurm")
    if src.inventory is not None:
        extra = [flag for flag, value in (("--gpus", src.gpus), ("--ssh-user", src.ssh_user),
                                          ("--ssh-config", src.ssh_config),
                                          ("--python", src.python), ("--data-nic", src.data_nic),
                                          ("--transport", src.transport)) if value is not None]
        if extra:
            where = ", ".join(f"{flag} as {_FILE_KEYS[flag]}" for flag in extra)
            raise UsageError(f"{', '.join(extra)} only apply to --ips, --hostfile and --slurm; with an INVENTORY "
                             f"file set them in {src.inventory} instead ({where})")
        return load_inventory(src.inventory), str(src.inventory)
    hosts: list[tuple[str, int | None, int | None]]  # host, ssh port, slots
    if src.ips is not None:
        flag = label = "--ips"
        hosts = [(s.host, s.port, None) for s in parse_ips(src.ips, flag)]
    elif src.hostfile is not None:
        flag, label = "--hostfile", f"--hostfile {src.hostfile}"
        hosts = [(e.host, None, e.slots) for e in parse_hostfile(_read(src.hostfile), str(src.hostfile))]
    else:
        flag = label = "--slurm" if src.slurm else "SLURM_JOB_NODELIST"
        hosts = [(h, None, None) for h in _slurm_hosts(src.slurm or environ.get("SLURM_JOB_NODELIST", ""), flag)]
    return _one_liner(src, flag, hosts, _transport(src, environ)), label


def _this_machine(src: HostSource) -> Inventory:
    """One local node (no SSH), as ``inventories/localhost.yaml`` has it, with the one-liner's --gpus,
    --nproc-per-node, --python and --data-nic; what only applies to remote nodes is refused."""
    remote = [flag for flag, value in (("--ssh-user", src.ssh_user), ("--ssh-config", src.ssh_config),
                                       ("--transport", src.transport)) if value is not None]
    if remote:
        raise UsageError(f"{', '.join(remote)} only apply to remote nodes; SCRIPT alone runs on this machine without "
                         "SSH (name the nodes with --ips, --hostfile, --slurm or an INVENTORY file)")
    return _one_liner(src, "--gpus", [("127.0.0.1", None, None)], "local", names=["localhost"])


def _transport(src: HostSource, environ: Mapping[str, str]) -> str:
    """The one-liner's transport: ``--transport``, else srun for ``--slurm`` inside an allocation, else ssh."""
    if src.transport is not None and src.transport not in TRANSPORTS:
        raise UsageError(f"--transport: expected one of {', '.join(TRANSPORTS)}, got {brief_repr(src.transport)}")
    in_allocation = bool(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"))
    transport = src.transport or ("srun" if src.slurm is not None and in_allocation else "ssh")
    if transport == "srun":
        ssh_flags = [flag for flag, value in (("--ssh-user", src.ssh_user), ("--ssh-config", src.ssh_config))
                     if value is not None]
        if ssh_flags:
            why = ("--transport srun reaches the nodes with srun" if src.transport else
                   "inside a Slurm allocation --slurm reaches the nodes with srun")
            verb = "applies" if len(ssh_flags) == 1 else "apply"
            raise UsageError(f"{' and '.join(ssh_flags)} only {verb} to SSH, and {why}; add --transport ssh to "
                             "reach the nodes over SSH instead")
    return transport


def _slurm_hosts(nodelist: str, flag: str) -> list[str]:
    if flag == "SLURM_JOB_NODELIST" and not nodelist.strip():
        raise UsageError("--slurm without a node list reads SLURM_JOB_NODELIST, which is not set: run inside a "
                         "Slurm allocation (salloc, sbatch) or pass the node list, like --slurm gpu[01-04]")
    hosts: list[str] = []
    first: dict[str, int] = {}
    for index, name in enumerate(expand_hostlist(nodelist, flag), start=1):
        try:
            host = normalize_host(name)
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None
        if host.lower() in first:
            raise UsageError(f"{flag}: host {brief_repr(host)} is listed twice in {brief_repr(nodelist)} (hosts {first[host.lower()]} "
                             f"and {index} of the expansion); list each host once")
        first[host.lower()] = index
        hosts.append(host)
    return hosts


def _one_liner(src: HostSource, flag: str, hosts: list[tuple[str, int | None, int | None]],
               transport: str = "ssh", names: list[str] | None = None) -> Inventory:
    gpus = list(parse_gpu_list(src.gpus)) if src.gpus is not None else None
    defaults: dict[str, Any] = {"transport": transport}
    ssh: dict[str, Any] = {}
    if src.ssh_user is not None:
        ssh["user"] = _word(src.ssh_user, "--ssh-user", "a user name without spaces", spaces=False)
    if src.ssh_config is not None:
        ssh["config_file"] = str(src.ssh_config)
    if ssh:
        defaults["ssh"] = ssh
    # Without --python the nodes run this interpreter's path, as DeepSpeed does: right on shared or identically
    # built machines (where `python3` on the PATH usually lacks torch); preflight says so where it is missing.
    defaults["python"] = (_word(src.python, "--python", "the interpreter's path on the nodes", spaces=True)
                          if src.python is not None else sys.executable)
    if src.nproc_per_node is not None:
        defaults["nproc_per_node"] = src.nproc_per_node
    nodes: list[dict[str, Any]] = []
    for name, (host, port, slots) in zip(names or _node_names([(h, p) for h, p, _ in hosts]), hosts, strict=True):
        node: dict[str, Any] = {"name": name, "host": host}
        if port is not None:
            node["ssh"] = {"port": port}
        if gpus is not None:
            node["gpus"] = gpus
        if slots is not None and src.nproc_per_node is None:
            node["nproc_per_node"] = slots
        nodes.append(node)
    data: dict[str, Any] = {"version": 1, "defaults": defaults, "nodes": nodes}
    if src.data_nic is not None:
        data["network"] = {"data": src.data_nic}
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:
        problems = _problems(exc, data, flag)
        raise UsageError(problems[0] if len(problems) == 1 else
                         f"{len(problems)} problems:\n  " + "\n  ".join(problems)) from None


def _node_names(hosts: list[tuple[str, int | None]]) -> list[str]:
    """A valid, unique node name per host: the host itself where it can be, else derived from it."""
    repeats = Counter(host.lower() for host, _ in hosts)
    taken: set[str] = set()
    names: list[str] = []
    for host, port in hosts:
        base = f"{host}-{port}" if repeats[host.lower()] > 1 and port is not None else host
        if not _NAME_RE.fullmatch(base):
            base = _NAME_BAD_CHARS_RE.sub("-", base)
            base = (base if base[:1].isalnum() else f"node{base}")[:_NAME_MAX]
        name, n = base, 2
        while name.lower() in taken:
            name, n = f"{base[:_NAME_MAX - len(str(n)) - 1]}-{n}", n + 1
        taken.add(name.lower())
        names.append(name)
    return names


def _problems(exc: ValidationError, data: dict[str, Any], source_flag: str) -> list[str]:
    """One line per validation problem, each starting with the flag the value came from."""
    out: list[str] = []
    for error in exc.errors(include_url=False):
        if error["type"] == "inventory_rules":
            located = [(tuple(p), m) for p, m in error["ctx"]["problems"]]
        else:
            msg = str(error["msg"]).removeprefix("Value error, ")
            msg = msg[:1].lower() + msg[1:]
            if not isinstance(error.get("input"), (dict, list)) and brief_repr(error.get("input")) not in msg:
                msg += f", got {brief_repr(error.get('input'))}"
            located = [(tuple(p for p in error["loc"] if not str(p).startswith("function-")), msg)]
        for loc, msg in located:
            path = tuple(str(p) for p in loc if not isinstance(p, int))
            flag = next((f for prefix, f in _FLAG_OF_PATH.items() if path[:len(prefix)] == prefix), source_flag)
            where = f"node {brief_repr(data['nodes'][loc[1]]['host'])}: " if loc[:1] == ("nodes",) and len(loc) > 1 else ""
            out.append(f"{flag}: {where}{format_path(loc)}: {msg}")
    return out


def _read(path: Path) -> str:
    return read_text_file(path, "hostfile", "no such hostfile; write one host per line, like 'worker-1 slots=4'")


def _word(value: str, flag: str, what: str, *, spaces: bool) -> str:
    if not value.strip() or (not spaces and any(c.isspace() for c in value.strip())):
        raise UsageError(f"{flag}: expected {what}, got {brief_repr(value)}")
    return value.strip()


def _no_match(inv: Inventory, flag: str, what: str) -> UsageError:
    labels = sorted({label for n in inv.nodes for label in n.labels})
    have = f"nodes: {_cut(compress_hostlist([n.name for n in inv.nodes]))}"
    have += f"; labels: {_cut(', '.join(labels))} (select with label=VALUE)" if labels else ""
    return UsageError(f"{flag}: {what}; {have}")


def _cut(text: str, limit: int = 200) -> str:
    """``text``, cut to ``limit`` characters for a one-line message."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
