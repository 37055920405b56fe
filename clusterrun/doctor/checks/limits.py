"""Process limits, /dev/shm, NCCL settings that leak in from the node, and clock skew.

All pure: they read the probe's ``ulimit_memlock``, ``ulimit_nofile``, ``shm``, ``nccl_conf`` and
``env_nccl`` sections and each node's ``clock_offset_s``.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from functools import partial

from clusterrun.doctor.facts import Section
from clusterrun.doctor.model import Evidence, Finding, Scope, Verdict
from clusterrun.doctor.registry import Context, check
from clusterrun.errors import ClusterrunError
from clusterrun.inventory.models import Inventory, Node

MIB = 1024  # in KiB, the unit of `ulimit -l` and `df -k`
GIB = 1024 * MIB
SHM_MIN_KIB = 1 * GIB
NOFILE_MIN = 65536
SKEW_WARN_S = 1.0
SKEW_FAIL_S = 60.0
_DF_LINE = re.compile(r"^(?P<fs>\S.*?)\s+(?P<size>\d+)\s+(?P<used>\d+)\s+(?P<avail>\d+)\s+(?P<cap>\d+%|-)\s+"
                      r"(?P<mount>/.*)$")
_CONF_HEADER = re.compile(r"^# (/\S*nccl\.conf)$")
_ENV_LINE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")


def size_text(kib: int) -> str:
    """``64`` -> ``64 KiB``, ``65536`` -> ``64 MiB``, ``24683656`` -> ``23.5 GiB``."""
    for unit, size in (("GiB", GIB), ("MiB", MIB)):
        if kib >= size:
            return f"{kib / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{kib} KiB"


def _not_gathered(check_name: str, node: str, section: str) -> Finding:
    return Finding(check_name, Verdict.skipped, f"{node}: the probe did not gather {section}", node=node)


def _unreadable(check_name: str, node: str, section: Section, what: str, why: str) -> Finding:
    return Finding(check_name, Verdict.warned, f"{node}: could not read {what} from `{section.command}`: {why!r}",
                   node=node, subject=what, hint=f"run `{section.command}` on {node} in a login shell and compare "
                   "with the evidence", evidence=(section.evidence(node),), data={"exit_code": section.exit_code})


def _limit(section: Section) -> int | None:
    """``ulimit`` output: a number, or None for ``unlimited``. Raises ValueError with the output otherwise."""
    text = section.output.strip()
    if section.ok and text == "unlimited":
        return None
    if section.ok and text.isdigit():
        return int(text)
    raise ValueError(text or f"no output (exit {section.exit_code})")


def _limits(ctx: Context, check_name: str, section_name: str,
            what: str) -> tuple[list[Finding], list[tuple[Node, Section, int | None]]]:
    """Each reachable node's ``ulimit`` value (None: unlimited), and findings for the nodes where it is unknown."""
    unread: list[Finding] = []
    limits: list[tuple[Node, Section, int | None]] = []
    for node in ctx.reachable():
        section = ctx.facts[node.name].section(section_name)
        if section is None:
            unread.append(_not_gathered(check_name, node.name, section_name))
            continue
        try:
            limits.append((node, section, _limit(section)))
        except ValueError as exc:
            unread.append(_unreadable(check_name, node.name, section, what, str(exc)))
    return unread, limits


@check("limits.memlock", "locked-memory limit is unlimited where RDMA is used", Scope.node,
       needs="every node; it matters on nodes with infiniband/roce NICs")
def check_memlock(ctx: Context) -> Iterator[Finding]:
    unread, limits = _limits(ctx, "limits.memlock", "ulimit_memlock", "the locked-memory limit")
    yield from unread
    for node, section, kib in limits:
        value = "unlimited" if kib is None else size_text(kib)
        finding = partial(Finding, "limits.memlock", node=node.name, subject="memlock", measured=value,
                          evidence=(section.evidence(node.name),), data={"memlock_kib": kib})
        if kib is None or not any(nic.kind.is_rdma for nic in node.nics):
            note = "" if kib is None else " (no InfiniBand/RoCE NICs listed, so RDMA does not need more)"
            yield finding(Verdict.passed, f"{node.name}: locked-memory limit is {value}{note}")
            continue
        yield finding(Verdict.warned, f"{node.name}: locked-memory limit is {value} (ulimit -l); RDMA needs unlimited",
                      expected="unlimited", hint="NCCL registers its buffers with the HCA and fails with 'ibv_reg_mr "
                      "... Cannot allocate memory' or 'ibv_create_cq failed' when it cannot lock them: add `* soft "
                      "memlock unlimited` and `* hard memlock unlimited` to /etc/security/limits.conf (then log in "
                      "again), or run containers with --ulimit memlock=-1")


@check("limits.nofile", "open-files limit is high enough", Scope.node, needs="every node")
def check_nofile(ctx: Context) -> Iterator[Finding]:
    unread, limits = _limits(ctx, "limits.nofile", "ulimit_nofile", "the open-files limit")
    yield from unread
    for node, section, limit in limits:
        value = "unlimited" if limit is None else str(limit)
        finding = partial(Finding, "limits.nofile", node=node.name, subject="nofile", measured=value,
                          evidence=(section.evidence(node.name),), data={"nofile": limit})
        if limit is None or limit >= NOFILE_MIN:
            yield finding(Verdict.passed, f"{node.name}: open-files limit is {value}")
            continue
        yield finding(Verdict.warned, f"{node.name}: open-files limit is {value} (ulimit -n), below {NOFILE_MIN}",
                      expected=f">= {NOFILE_MIN}", hint="every rank opens sockets to its peers, shared-memory segments "
                      "and DataLoader files: raise it with `* soft nofile 1048576` and `* hard nofile 1048576` in "
                      "/etc/security/limits.conf (a new login shows it in `ulimit -n`), or run containers with "
                      "--ulimit nofile=1048576:1048576")


@check("limits.shm", "/dev/shm is large enough for NCCL and DataLoader workers", Scope.node, needs="every node")
def check_shm(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        section = ctx.facts[node.name].section("shm")
        if section is None:
            yield _not_gathered("limits.shm", node.name, "shm")
            continue
        finding = partial(Finding, "limits.shm", node=node.name, subject="/dev/shm",
                          evidence=(section.evidence(node.name),))
        if not section.ok:
            yield finding(Verdict.failed, f"{node.name}: /dev/shm is missing "
                          f"({section.output.strip() or f'df exited {section.exit_code}'})",
                          hint="NCCL and PyTorch's DataLoader workers need a tmpfs at /dev/shm: mount one (`mount -t "
                          "tmpfs -o size=50% tmpfs /dev/shm`, and in /etc/fstab), or run containers with --ipc=host "
                          "or --shm-size=16g")
            continue
        match = next((m for line in section.output.splitlines()[1:] if (m := _DF_LINE.match(line.strip()))), None)
        if match is None:
            yield _unreadable("limits.shm", node.name, section, "the size of /dev/shm",
                              section.output.strip()[:200] or "no output")
            continue
        size, avail, mount = int(match["size"]), int(match["avail"]), match["mount"]
        finding = partial(finding, measured=size_text(size),
                          data={"size_kib": size, "available_kib": avail, "mounted_on": mount})
        if size < SHM_MIN_KIB:
            yield finding(Verdict.warned, f"{node.name}: /dev/shm is {size_text(size)}, under 1 GiB",
                          expected=">= 1 GiB", hint="Docker gives containers 64 MiB, which NCCL's shared-memory "
                          "transport and DataLoader workers fill ('No space left on device'): run with --ipc=host or "
                          "--shm-size=16g (Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm)")
        elif avail < SHM_MIN_KIB:
            yield finding(Verdict.warned, f"{node.name}: /dev/shm has only {size_text(avail)} free of "
                          f"{size_text(size)}", measured=f"{size_text(avail)} free", expected=">= 1 GiB free",
                          hint="files left by earlier jobs fill it: look at `ls -la /dev/shm` and remove the "
                          "nccl-*/torch_* segments of processes that no longer run")
        elif mount != "/dev/shm":
            yield finding(Verdict.warned, f"{node.name}: /dev/shm is not a tmpfs of its own (it is part of {mount}, "
                          f"{match['fs']})", hint="mount a tmpfs there (`mount -t tmpfs tmpfs /dev/shm`, and in "
                          "/etc/fstab) so shared memory stays in RAM")
        else:
            yield finding(Verdict.passed, f"{node.name}: /dev/shm is {size_text(size)} ({size_text(avail)} free)")


def clusterrun_sets(inventory: Inventory, node: Node) -> set[str]:
    """Variables clusterrun puts in this node's job environment itself (its rules and the inventory ``env``)."""
    from clusterrun.planning.nccl import RuleContext, rule_env
    from clusterrun.planning.network import resolve_data_network

    names = set(inventory.defaults.env) | set(node.env)
    try:
        path = resolve_data_network(inventory).path_of(node.name)
    except (ClusterrunError, StopIteration):
        return names
    return names | {key for key, _value, _rule in rule_env(RuleContext(node, path, len(inventory.nodes)))}


def _leak_hint(where: str, names: list[str], ours: set[str]) -> str:
    kept = [n for n in names if n in ours]
    also = f"; clusterrun sets {', '.join(kept)} itself, so those are overridden" if kept else ""
    return (f"{where}{also}. Remove the others there, or move them into the inventory `env` (defaults.env or the "
            "node's env) so every node runs with the same settings")


def parse_nccl_conf(text: str) -> dict[str, dict[str, str]]:
    """The probe's ``nccl_conf`` section: {file: {variable: value}}, for each ``# <path>`` header and its lines."""
    files: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if header := _CONF_HEADER.match(line):
            current = files.setdefault(header.group(1), {})
        elif current is not None and "=" in line and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            current[name.strip()] = value.strip()
    return files


@check("env.nccl_conf", "no NCCL settings hide in /etc/nccl.conf or ~/.nccl.conf", Scope.node, needs="every node")
def check_nccl_conf(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        section = ctx.facts[node.name].section("nccl_conf")
        if section is None:
            yield _not_gathered("env.nccl_conf", node.name, "nccl_conf")
            continue
        files = parse_nccl_conf(section.output)
        if not files:
            yield Finding("env.nccl_conf", Verdict.passed, f"{node.name}: no /etc/nccl.conf or ~/.nccl.conf",
                          node=node.name, evidence=(section.evidence(node.name),))
            continue
        ours = clusterrun_sets(ctx.inventory, node)
        for path, settings in files.items():
            names = sorted(settings)
            leaking = [n for n in names if n not in ours]
            finding = partial(Finding, "env.nccl_conf", node=node.name, subject=path,
                              measured=", ".join(names) or "nothing", evidence=(section.evidence(node.name),),
                              data={"file": path, "variables": settings, "leaking": leaking})
            if not leaking:
                what = f"sets only {', '.join(names)}, which clusterrun sets itself" if names else "sets nothing"
                yield finding(Verdict.passed, f"{node.name}: {path} {what}")
                continue
            yield finding(Verdict.warned, f"{node.name}: {path} sets {', '.join(leaking)} for every NCCL job on the "
                          "node", hint=_leak_hint(f"NCCL applies {path} to each variable the job's environment leaves "
                                                  "unset", names, ours))


@check("env.login", "no NCCL/Gloo variables leak in from the login environment", Scope.node, needs="every node")
def check_login_env(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        section = ctx.facts[node.name].section("env_nccl")
        if section is None:
            yield _not_gathered("env.login", node.name, "env_nccl")
            continue
        found = {m["name"]: m["value"] for line in section.output.splitlines() if (m := _ENV_LINE.match(line))}
        if not found:
            yield Finding("env.login", Verdict.passed, f"{node.name}: no NCCL_*/GLOO_*/TORCH_NCCL_* variables in the "
                          "login environment", node=node.name, evidence=(section.evidence(node.name),))
            continue
        ours = clusterrun_sets(ctx.inventory, node)
        names = sorted(found)
        leaking = [n for n in names if n not in ours]
        finding = partial(Finding, "env.login", node=node.name, subject="login environment", measured=", ".join(names),
                          evidence=(section.evidence(node.name),), data={"variables": found, "leaking": leaking})
        if not leaking:
            yield finding(Verdict.passed, f"{node.name}: the login environment sets {', '.join(names)}, which "
                          "clusterrun sets itself for its jobs")
            continue
        yield finding(Verdict.warned, f"{node.name}: the login environment sets {', '.join(leaking)}, which every job "
                      "started over SSH inherits", hint=_leak_hint("they come from a shell profile (~/.bashrc, "
                                                                   "/etc/profile.d/, /etc/environment)", names, ours))


@check("clock.skew", "node clocks agree", Scope.cluster, needs="two or more reachable nodes")
def check_clock(ctx: Context) -> Iterator[Finding]:
    offsets: dict[str, float] = {}
    for node in ctx.reachable():
        offset = ctx.facts[node.name].clock_offset_s
        if offset is None:
            yield Finding("clock.skew", Verdict.skipped, f"{node.name}: clock offset unknown (the probe printed no "
                          "clock reading)", node=node.name, subject="clock")
        else:
            offsets[node.name] = offset
    if len(offsets) < 2:
        which = f"only {next(iter(offsets))}'s clock is known" if offsets else "no node's clock is known"
        yield Finding("clock.skew", Verdict.skipped, f"clock skew not checked: {which}", subject="clock")
        return
    median = statistics.median(offsets.values())
    far = max(offsets, key=lambda n: abs(offsets[n] - median))
    spread = max(offsets.values()) - min(offsets.values())
    finding = partial(Finding, "clock.skew", subject="clock", measured=f"{spread:.2f} s",
                      expected=f"<= {SKEW_WARN_S:g} s", data={"offsets_s": offsets, "spread_s": spread},
                      evidence=(Evidence("date +%s.%N at the start of each probe, minus this machine's time",
                                         "\n".join(f"{n}: {o:+.3f} s" for n, o in offsets.items())),))
    if spread <= SKEW_WARN_S:
        yield finding(Verdict.passed, f"clocks of {len(offsets)} nodes agree within {spread:.2f} s")
        return
    verdict = Verdict.failed if spread > SKEW_FAIL_S else Verdict.warned
    yield finding(verdict, f"{far}: clock is {offsets[far] - median:+.1f} s off the median of {len(offsets)} nodes, "
                  f"whose clocks differ by up to {spread:.1f} s", node=far, hint="enable time sync on every node "
                  "(chrony: `systemctl enable --now chronyd`, check with `chronyc tracking`; or `timedatectl set-ntp "
                  "true`): torch elastic's rendezvous and heartbeats, TLS certificates and Kerberos tickets compare "
                  "clocks, and logs of skewed nodes cannot be lined up")
