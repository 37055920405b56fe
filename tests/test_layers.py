"""The package's layers: imports only run down, and code that runs on the nodes lives in clusterrun/remote/.

From the bottom: errors, waits (Ctrl-C-safe waits) and remote (node-side programs), inventory (models and loaders), facts (parsers of
tool output, a node's NICs, log hints), planning (the plan, NCCL rules, data network, container command, GPU choice,
the plan completed from facts), transport (local, Slurm, and SSH in transport/ssh/), runs (the run record)
and notify (webhooks), agents (clusterrun's side of the node agent: its specs, starting it, collect and sweep),
launch (`up`), ops (exec, down, logs, init), doctor, report (the HTML pages of runs and doctor rounds), cli. A module may import its own layer and those below,
at the top of the file or inside a function alike; no modules import each other, directly or around a circle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from clusterrun.remote import AGENT_MODULES, bundle, protocol

ROOT = Path(__file__).resolve().parent.parent / "clusterrun"

LAYERS: list[set[str]] = [
    {"errors", "remote", "redact", "waits"},
    {"inventory"},
    {"facts"},
    {"planning"},
    {"transport"},
    {"runs", "notify"},
    {"agents"},
    {"launch", "detached"},
    {"ops", "export"},
    {"doctor"},
    {"report"},
    {"cli", "__main__", "__init__"},
]
LEVEL = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _part(module: str) -> str:
    """``clusterrun.launch.up`` -> ``launch``; ``clusterrun`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1].removesuffix(".py") if len(parts) > 1 else "__init__"


def _modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def _name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "clusterrun":  # from clusterrun import remote
                found += [(node.lineno, f"clusterrun.{alias.name}") for alias in node.names
                          if (ROOT / alias.name).is_dir() or (ROOT / f"{alias.name}.py").is_file()]
    return found


def test_every_top_level_part_has_a_layer() -> None:
    parts = {p.name.removesuffix(".py") for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert parts - {"py"} <= set(LEVEL), f"no layer for {sorted(parts - set(LEVEL))}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: _name(p))
def test_imports_only_run_down(path: Path) -> None:
    own = _part(_name(path))
    wrong = [f"line {line}: {target}" for line, target in _imports(path)
             if target.startswith("clusterrun.") and _part(target) != own and LEVEL[_part(target)] > LEVEL[own]]
    assert not wrong, f"{_name(path)} ({own}) imports from a layer above it: {wrong}"


STDLIB = set(sys.stdlib_module_names)


@pytest.mark.parametrize("path", sorted((ROOT / "remote").glob("*.py")), ids=lambda p: p.name)
def test_node_programs_need_only_the_standard_library(path: Path) -> None:
    # torch only where the program is about torch: the report of its versions, the all-reduce under torchrun.
    needs_torch = path.name in ("allreduce_smoke.py", "pyreport.py")
    allowed = STDLIB | {*AGENT_MODULES, "clusterrun.remote", "clusterrun"} | ({"torch"} if needs_torch else set())
    outside = [f"line {line}: {target}" for line, target in _imports(path)
               if target.split(".")[0] not in allowed and target not in allowed]
    assert not outside, f"{path.name} imports what a node may not have: {outside}"
    ast.parse(path.read_text(encoding="utf-8"), str(path), feature_version=(3, 8))  # the oldest Python it runs on


def _module_imports(path: Path) -> list[tuple[int, str]]:
    """What a module imports when it is loaded (its top level and the branches there, not what functions import
    when called, nor what type checkers alone read)."""
    found: list[tuple[int, str]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((node.lineno, node.module))
                found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                             if bundle.module_path(f"{node.module}.{alias.name}").is_file()
                             and node.module.startswith("clusterrun"))
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(node.orelse)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


def test_the_cluster_supervisor_takes_all_it_imports_and_only_the_standard_library() -> None:
    # A detached run's supervisor runs clusterrun's own modules on rank 0's node (remote/bundle.py): one policy
    # for attached and detached runs. What they import when loaded must be in the bundle, or the standard library.
    shipped = set(bundle.SUPERVISOR_MODULES)
    missing, foreign = [], []
    for name in sorted(shipped):
        for line, target in _module_imports(bundle.module_path(name)):
            if target.startswith("clusterrun."):
                if target not in shipped and bundle.module_path(target).is_file():
                    missing.append(f"{name}:{line} {target}")
            elif target.split(".")[0] not in STDLIB and target != "clusterrun" and target not in AGENT_MODULES:
                foreign.append(f"{name}:{line} {target}")
    assert not missing, f"imported by the cluster supervisor but not in remote.bundle.SUPERVISOR_MODULES: {missing}"
    assert not foreign, f"the cluster supervisor may use the standard library only: {foreign}"


def _program_strings(path: Path) -> list[int]:
    """Lines of string constants that hold a program (several lines, importing modules) outside remote/."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count("\n") >= 3:
            lines = [line.strip() for line in node.value.splitlines()]
            if any(line.startswith(("import ", "from ")) and " import " not in line[:5] for line in lines) and any(
                    line.startswith(("def ", "for ", "if ", "print(")) for line in lines):
                hits.append(node.lineno)
    return hits


@pytest.mark.parametrize("path", [p for p in _modules() if "remote" not in p.parts], ids=lambda p: _name(p))
def test_no_program_travels_in_a_string(path: Path) -> None:
    assert not _program_strings(path), f"{_name(path)} carries a program in a string at lines {_program_strings(path)}"


def _import_graph() -> dict[str, set[str]]:
    """Module -> the clusterrun modules it imports, anywhere in it (top level, functions, type-checking blocks):
    ``from P import a`` is an edge to the module ``P.a`` where there is one, else to ``P``."""
    names = {_name(p) for p in _modules()}
    graph: dict[str, set[str]] = {}
    for path in _modules():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{alias.name}" for alias in node.names} & names
                found |= subs
                if len(subs) < len(node.names):
                    found.add(node.module)
        graph[_name(path)] = (found & names) - {_name(path)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_finds_a_cycle_and_only_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "f": {"d"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({**graph, "c": {"d"}}) == []


def test_no_import_cycle() -> None:
    # Modules that import each other, even from inside a function, cannot be read, tested or moved one at a time:
    # what both need goes into a module of its own, below them (as cli/run_args.py and cli/pages.py).
    graph = _import_graph()
    assert graph["clusterrun.cli.runs_cmd"], "the import graph found no imports: it reads nothing"
    cycles = _cycles(graph)
    assert not cycles, f"modules that import each other, directly or around a circle: {cycles}"


def test_a_run_s_marks_are_spelled_once() -> None:
    # The environment variables a run's processes are found by: remote/protocol.py names them (nodes and clusterrun
    # alike), everything else imports the name; a second spelling would find nothing once the first one changes.
    marks = (protocol.RUN_ID_VAR, protocol.NODE_VAR)
    spelled = [(_name(path), node.lineno) for path in _modules()
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and any(node.value == mark or f"{mark}=" in node.value for mark in marks)]
    assert [name for name, _ in spelled] == ["clusterrun.remote.protocol"] * len(marks), spelled


def test_launch_holds_at_most_twelve_modules() -> None:
    # `up` alone: what serves other commands too (the agent link, collect, sweep, gather) lives in
    # clusterrun/agents/, the plan completed from the nodes' facts in clusterrun/planning/.
    modules = [p.name for p in (ROOT / "launch").glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= 12, sorted(modules)


def test_the_rooms_hold_what_they_are_for() -> None:
    # Planning is one package; SSH is a subpackage of transport; nothing outside launch/ and detached/ imports
    # launch/ but the CLI, doctor (its cluster all-reduce is a real `up`) and the report (the record's types).
    assert {p.stem for p in (ROOT / "planning").glob("*.py")} >= {"plan", "planfile", "nccl", "network", "container",
                                                                  "gpuchoice", "complete"}
    assert not [p.name for p in (ROOT / "transport").glob("*.py") if "ssh" in p.name or p.stem in (
        "known_hosts", "jump_spec", "paramiko_lib", "dial")]
    users = {_name(path) for path in _modules() for _line, target in _imports(path)
             if target.startswith("clusterrun.launch") and _part(_name(path)) not in ("launch", "detached")}
    assert {_part(user) for user in users} <= {"cli", "doctor", "report", "ops"}, sorted(users)


MAX_LINES = 400


def test_no_module_passes_the_size_where_it_should_be_split() -> None:
    big = {_name(p): n for p in _modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split them by concept): {big}"


def test_ops_uses_no_service_of_launch() -> None:
    # exec, down, logs and init share services with `up` through the layers below (agents/, facts/, runs/),
    # not through launch/, which is `up` alone. The layer order allows it; this rule does not.
    found = [(_name(p), line, module) for p in sorted((ROOT / "ops").glob("*.py"))
             for line, module in _imports(p) if _part(module) == "launch"]
    assert not found, found
