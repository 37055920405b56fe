"""Node checks: SSH, operating system, the inventory python and torch, versions equal across nodes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from clusterrun.doctor.model import Finding, Scope, Verdict
from clusterrun.doctor.registry import Context, check


@check("node.ssh", "SSH reachable", Scope.node)
def ssh_reachable(ctx: Context) -> Iterator[Finding]:
    for node in ctx.nodes():
        facts = ctx.facts.get(node.name)
        if facts is None:
            continue
        if not facts.reachable:
            yield Finding("node.ssh", Verdict.failed, f"{node.name}: {facts.error}", node=node.name,
                          subject=node.host, hint="every other check of this node is skipped until it answers")
            continue
        connect = f"connect {facts.connect_ms:.0f} ms, " if facts.connect_ms is not None else ""
        rtt = f"round trip {facts.latency_ms:.1f} ms" if facts.latency_ms is not None else ""
        yield Finding("node.ssh", Verdict.passed, f"{node.name}: reachable as {node.host} ({connect}{rtt})",
                      node=node.name, subject=node.host, measured=f"{facts.latency_ms or 0:.1f} ms",
                      data={"connect_ms": facts.connect_ms, "latency_ms": facts.latency_ms})


def _os_name(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return "unknown OS"


@check("node.os", "OS and kernel", Scope.node)
def os_kernel(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        facts = ctx.facts[node.name]
        kernel = (facts.output("uname") or "unknown kernel").strip()
        name = _os_name(facts.output("os_release"))
        yield Finding("node.os", Verdict.passed, f"{node.name}: {name}, {kernel}", node=node.name,
                      measured=f"{name}; {kernel}", data={"os": name, "kernel": kernel})


#: How the pass finding says where its facts come from: the probe reads torch's files, it does not import torch.
NOT_IMPORTED = "read from its files, not imported"


@check("node.python", "python, torch and its distributed backends", Scope.node)
def python_torch(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        facts = ctx.facts[node.name]
        python = ctx.inventory.python_of(node)
        section = facts.section("python")
        evidence = (section.evidence(node.name),) if section else ()
        report = facts.python
        if section is None or section.missing or not report:
            why = "not found" if section is None or section.missing else f"did not run ({(section.output or '').strip()[-200:]})"
            yield Finding("node.python", Verdict.failed, f"{node.name}: python {python} {why}", node=node.name,
                          subject=python, evidence=evidence,
                          hint="set `python` in the inventory (defaults or the node) to an interpreter that exists "
                               "there, by absolute path")
            continue
        if "torch_error" in report or not report.get("torch"):
            yield Finding("node.python", Verdict.failed,
                          f"{node.name}: {python} has no torch: {report.get('torch_error', 'no version found')}"
                          f"{_where(report)}", node=node.name, subject=python, evidence=evidence,
                          hint=_left_venv(report) or "install torch in that environment, or point `python` at one "
                                                     "that has it",
                          data={k: report[k] for k in _WHERE_KEYS if k in report})
            continue
        backends = list(report.get("backends") or [])
        versions = _versions(report)
        needed = ["nccl"] if node.gpus else ["gloo"]
        missing = [b for b in needed if b not in backends]
        if missing:
            why = ("this torch is a CPU-only build (no CUDA version in its version.py)" if node.gpus
                   else "this torch build lacks it")
            yield Finding("node.python", Verdict.failed,
                          f"{node.name}: torch has no {', '.join(missing)} backend ({versions}); {why}",
                          node=node.name, subject=python, measured=", ".join(backends) or "none",
                          expected=", ".join(needed), evidence=evidence,
                          hint="install a CUDA build of torch matching the driver" if node.gpus else
                               "install a torch build with gloo")
            continue
        # Whether torch imports and sees the GPUs is known only by importing it: cluster.allreduce does.
        yield Finding("node.python", Verdict.passed,
                      f"{node.name}: {versions}; backends {', '.join(backends)} ({NOT_IMPORTED})",
                      node=node.name, subject=python, measured=versions, evidence=evidence, data=dict(report))


_WHERE_KEYS = ("executable", "realpath", "prefix", "base_prefix", "venv_on_path")


def _where(report: Mapping[str, Any]) -> str:
    """``; sys.executable X (real path Y), sys.prefix Z``: which installation the interpreter ran as."""
    if not report.get("prefix"):
        return ""  # a report from before these keys
    real = report.get("realpath")
    real = f" (real path {real})" if real and real != report.get("executable") else ""
    return f"; sys.executable {report.get('executable')}{real}, sys.prefix {report['prefix']}"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _left_venv(report: Mapping[str, Any]) -> str | None:
    """Why an interpreter that links into a venv runs without it, when it does: the fix, else None."""
    found = report.get("venv_on_path") or {}
    venv, link, prefix = found.get("venv"), found.get("link"), report.get("prefix")
    real = report.get("realpath") or ""
    if not venv or not link or not prefix or _inside(prefix, venv) or _inside(real, venv):
        return None
    return (f"{report.get('executable')} is a symlink to {link} of the venv {venv}, but its real path {real} is "
            f"outside that venv and Python looks for pyvenv.cfg only beside the path it was started by, so it ran "
            f"as {prefix} without the venv's packages: set `python` to {link} itself (or activate the venv in a "
            f"wrapper script rather than linking to its interpreter)")


def _versions(report: Mapping[str, Any]) -> str:
    """``python 3.11.7, torch 2.3.1+cu121, CUDA 12.1, NCCL 2.20.5`` from what the report knows."""
    versions = f"python {report.get('python')}, torch {report.get('torch')}"
    if report.get("cuda"):
        versions += f", CUDA {report['cuda']}"
    if report.get("hip"):
        versions += f", ROCm {report['hip']}"
    if report.get("nccl"):
        versions += f", NCCL {report['nccl']}"
    elif report.get("nccl_unknown"):
        versions += ", NCCL built in (its version shows on import)"
    return versions


_VERSIONED = (("python", "python"), ("torch", "torch"), ("cuda", "CUDA"), ("hip", "ROCm"), ("nccl", "NCCL"))


@check("node.versions", "same python, torch, CUDA and NCCL on every node", Scope.cluster)
def same_versions(ctx: Context) -> Iterator[Finding]:
    reports = {n.name: ctx.facts[n.name].python for n in ctx.reachable() if ctx.facts[n.name].python.get("torch")}
    if len(reports) < 2:
        yield Finding("node.versions", Verdict.skipped, "fewer than two nodes reported their torch")
        return
    odd_found = False
    for key, label in _VERSIONED:
        values = {name: str(r.get(key)) for name, r in reports.items() if r.get(key)}
        if len(set(values.values())) <= 1:
            continue
        odd_found = True
        common, _ = Counter(values.values()).most_common(1)[0]
        odd = {name: v for name, v in values.items() if v != common}
        yield Finding("node.versions", Verdict.warned,
                      f"{label} differs: {', '.join(f'{n} has {v}' for n, v in odd.items())}; the others have {common}",
                      subject=label, measured=", ".join(f"{n}={v}" for n, v in odd.items()), expected=common,
                      hint=f"install the same {label} everywhere: mixed versions fail at init or hang in collectives",
                      data={"values": values})
    if not odd_found:
        first = next(iter(reports.values()))
        same = ", ".join(f"{label} {first.get(key)}" for key, label in _VERSIONED if first.get(key))
        yield Finding("node.versions", Verdict.passed, f"all {len(reports)} nodes: {same}", measured=same)
