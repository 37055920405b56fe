"""The docs stay true: their inventory examples validate, their error examples fail as shown,
their schema is the current one, and every environment rule and doctor check is documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clusterrun.doctor.registry import all_checks
from clusterrun.errors import InventoryError
from clusterrun.inventory.models import inventory_json_schema
from clusterrun.inventory.yaml_source import parse_inventory_text
from clusterrun.planning.nccl import RULES

DOCS = Path(__file__).resolve().parent.parent / "docs"
INVENTORY_MD = DOCS / "inventory.md"
NETWORK_MD = DOCS / "network.md"
DOCTOR_MD = DOCS / "doctor.md"
ONELINERS_MD = DOCS / "oneliners.md"
OPERATIONS_MD = DOCS / "operations.md"
CONTAINERS_MD = DOCS / "containers.md"

# A fenced block: its language and its body (the fences start at the beginning of a line).
_FENCE_RE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def fenced_blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in _FENCE_RE.findall(path.read_text(encoding="utf-8")) if lang == language]


def marked_yaml(path: Path, marker: str) -> list[pytest.param]:
    """The ``yaml`` blocks of ``path`` whose first line starts with ``marker``, named by that line."""
    return [
        pytest.param(body, id=f"{path.name}: {body.splitlines()[0]}")
        for body in fenced_blocks(path, "yaml")
        if body.startswith(marker)
    ]


def invalid_examples() -> list[pytest.param]:
    """Each ``# invalid`` yaml block of inventory.md with the ``console`` block that follows it."""
    blocks = _FENCE_RE.findall(INVENTORY_MD.read_text(encoding="utf-8"))
    cases = []
    for i, (lang, body) in enumerate(blocks):
        if lang == "yaml" and body.startswith("# invalid"):
            shown_lang, shown = blocks[i + 1]
            assert shown_lang == "console", f"no console output after {body.splitlines()[0]!r}"
            cases.append(pytest.param(body, shown, id=body.splitlines()[0]))
    return cases


@pytest.mark.parametrize("text", [p for path in (INVENTORY_MD, NETWORK_MD, DOCTOR_MD, ONELINERS_MD, CONTAINERS_MD)
                                  for p in marked_yaml(path, "# inventory")])
def test_documented_inventory_is_valid(text: str) -> None:
    inv = parse_inventory_text(text, "docs example")
    assert inv.nodes


def test_documented_init_output_is_valid() -> None:
    shown = [b for b in fenced_blocks(OPERATIONS_MD, "yaml") if b.startswith("# Written by `clusterrun init")]
    assert shown, "operations.md shows an inventory as `clusterrun init` writes it"
    for text in shown:
        assert parse_inventory_text(text, "docs example").nodes


def test_inventory_reference_has_full_examples() -> None:
    assert len(marked_yaml(INVENTORY_MD, "# inventory")) >= 5


@pytest.mark.parametrize("path", [INVENTORY_MD, NETWORK_MD, DOCTOR_MD, ONELINERS_MD, CONTAINERS_MD],
                         ids=lambda p: p.name)
def test_every_yaml_example_is_marked_so_it_is_checked(path: Path) -> None:
    unmarked = [
        body.splitlines()[0]
        for body in fenced_blocks(path, "yaml")
        if not body.startswith(("# inventory", "# invalid"))
    ]
    assert unmarked == [], "start each yaml example with '# inventory' (checked valid) or '# invalid'"


@pytest.mark.parametrize(("text", "shown"), invalid_examples())
def test_invalid_example_fails_with_the_message_shown(text: str, shown: str) -> None:
    command, *output = shown.rstrip("\n").splitlines()
    source = command.removeprefix("$ clusterrun check ").strip()
    with pytest.raises(InventoryError) as info:
        parse_inventory_text(text, source)
    assert str(info.value).splitlines() == output


def test_documented_schema_is_the_current_one() -> None:
    shown = fenced_blocks(INVENTORY_MD, "json")[-1]
    assert json.loads(shown) == inventory_json_schema(), "regenerate the block with `clusterrun schema`"


@pytest.mark.parametrize("rule", [rule.name for rule in RULES])
def test_every_environment_rule_is_documented(rule: str) -> None:
    assert f"`{rule}`" in NETWORK_MD.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", list(all_checks()))
def test_every_doctor_check_is_documented(name: str) -> None:
    assert f"| `{name}` |" in DOCTOR_MD.read_text(encoding="utf-8"), "add a row for the check to docs/doctor.md"


def _documented_job_commands() -> list[pytest.param]:
    """Every `clusterrun up|plan ...` line of the docs, the README and the commands' own examples."""
    import shlex

    sources = [*sorted(DOCS.glob("*.md")), DOCS.parent / "README.md", *sorted((DOCS.parent / "clusterrun" / "cli")
                                                                                  .glob("*_cmd.py"))]
    found = []
    for path in sources:
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            at = line.find("clusterrun up ") if "clusterrun up " in line else line.find("clusterrun plan ")
            if at < 0:
                continue
            text = line[at:].split("  #")[0].split("`")[0].split(" | ")[0].split('"""')[0].rstrip(" \\")
            try:
                words = shlex.split(text)
            except ValueError:
                continue
            shown = lines[number] if number < len(lines) else ""  # the line after: the error an example shows
            found.append(pytest.param(words, shown, id=f"{path.name}:{number}"))
    return found


@pytest.mark.parametrize(("words", "shown"), _documented_job_commands())
def test_documented_commands_give_clusterrun_its_options_before_script(words: list[str], shown: str) -> None:
    """After SCRIPT everything is the script's (as with torchrun): an example with clusterrun's options there
    would teach users a command that silently does something else. An example of a refused command line shows
    the error it gets on its next line."""
    import click

    from clusterrun.cli.job_argv import _options, split
    from clusterrun.cli.main import cli
    from clusterrun.errors import UsageError

    command = cli.get_command(click.Context(cli), words[1])
    assert command is not None
    try:
        _ours, _positionals, script_args, explicit = split(command, words[2:], ("--ips", "--hostfile", "--slurm"))
    except UsageError as exc:
        assert shown == f"clusterrun: error: {exc}"
        return
    ours = _options(command)
    mine = [w for w in script_args if w.split("=")[0] in ours and w not in ("--epochs", "--lr") and not explicit]
    assert not mine, f"{' '.join(words)}: {mine} would go to the script"
