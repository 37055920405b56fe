"""The command line: help with examples on every command, plan output, errors and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clusterrun import __version__
from clusterrun.cli.main import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
TWO_NODE = str(ROOT / "inventories" / "two-node-ethernet.yaml")
IB = str(ROOT / "inventories" / "four-node-infiniband.yaml")
TRAIN = str(ROOT / "examples" / "train_ddp.py")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_help_with_an_example(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, _ = cli(capsys, command, "--help")
    assert code == 0
    assert "Examples:" in out and f"clusterrun {command} " in out


@pytest.mark.parametrize("command", ["up", "down"])
def test_grace_defaults_to_the_agent_s_own_and_help_shows_it(command: str) -> None:
    import importlib

    import click

    from clusterrun.remote import protocol

    module, name, _ = COMMANDS[command]
    params = getattr(importlib.import_module(module), name).params
    grace = next(p for p in params if isinstance(p, click.Option) and "--grace" in p.opts)
    assert grace.default == protocol.GRACE and grace.show_default


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "--version")
    assert code == 0 and __version__ in out


def test_top_level_help_imports_nothing_heavy() -> None:
    probe = ("import sys; from clusterrun.cli.main import main; main(['--help']); "
             "heavy = [m for m in ('torch', 'paramiko', 'pydantic', 'rich', 'fabric', 'yaml') if m in sys.modules]; "
             "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out


def test_plan_json_two_node(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "plan", "--json", TWO_NODE, TRAIN)
    assert code == 0
    plan = json.loads(out)
    nodes = plan["nodes"]
    assert [n["node_rank"] for n in nodes] == [0, 1]
    assert {n["master_addr"] for n in nodes} == {"10.10.0.21"}
    assert [n["env"]["NCCL_SOCKET_IFNAME"] for n in nodes] == ["=ens2f0", "=enp65s0f0"]
    assert nodes[0]["argv"][nodes[0]["argv"].index("--node-rank") + 1] == "0"


def test_plan_json_infiniband(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "plan", "--json", IB, "train.py")
    assert code == 0  # shared_fs: the script need not exist here
    assert {n["env"]["NCCL_IB_HCA"] for n in json.loads(out)["nodes"]} == {"=mlx5_0:1,mlx5_1:1"}


def test_script_args_are_passed_through(capsys: pytest.CaptureFixture[str]) -> None:
    # As with torchrun, everything after SCRIPT is the script's, even options clusterrun has too, in order.
    code, out, _ = cli(capsys, "plan", "--json", TWO_NODE, TRAIN, "--lr", "0.1", "--json", "--epochs=5", "-x",
                       "--", "-e", "A=1", "-m", "foo", "~/data")
    assert code == 0
    node = json.loads(out)["nodes"][0]
    assert node["argv"][-12:] == [node["script"], "--lr", "0.1", "--json", "--epochs=5", "-x", "--", "-e", "A=1",
                                  "-m", "foo", "~/data"]
    assert "A" not in node["env"] and node["argv"][node["argv"].index(node["script"]) - 1] != "-m"


def test_options_before_script_shape_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "plan", "--nproc-per-node", "2", "-e", "NCCL_DEBUG=INFO", "--master-port", "29600",
                       "--json", TWO_NODE, TRAIN)
    assert code == 0
    node = json.loads(out)["nodes"][1]
    assert node["nproc_per_node"] == 2 and node["master_port"] == 29600
    assert node["env"]["NCCL_DEBUG"] == "INFO" and node["env_sources"]["NCCL_DEBUG"] == "--env"


def test_plan_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "plan", TWO_NODE, TRAIN)
    assert code == 0
    assert "gpu-b" in out and "=enp65s0f0" in out and "torch.distributed.run" in out


def test_dry_run_prints_the_same_plan(capsys: pytest.CaptureFixture[str]) -> None:
    _, planned, _ = cli(capsys, "plan", "--json", TWO_NODE, TRAIN)
    code, dry, _ = cli(capsys, "up", "--dry-run", "--json", TWO_NODE, TRAIN)
    assert code == 0
    strip = lambda text: {k: v for k, v in json.loads(text).items() if k != "run_id"}  # noqa: E731
    a, b = strip(planned), strip(dry)
    for node in a["nodes"] + b["nodes"]:  # the run id differs between two invocations, nothing else
        node.pop("run_dir"), node.pop("cwd"), node.pop("script"), node.pop("argv")
        node["env"].pop("CLUSTERRUN_RUN_ID")
    assert a == b


def test_dry_run_shows_the_restarts_the_workers_will_see(capsys: pytest.CaptureFixture[str]) -> None:
    code, dry, _ = cli(capsys, "up", "--dry-run", "--json", "--max-restarts", "3", TWO_NODE, TRAIN)
    assert code == 0
    assert {node["env"].get("CLUSTERRUN_MAX_RESTARTS") for node in json.loads(dry)["nodes"]} == {"3"}


def test_bad_inventory_exit_code_and_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - name: a\n    hots: h\n")
    code, _, err = cli(capsys, "plan", str(bad), TRAIN)
    assert code == 2
    assert f"{bad}:3:5: nodes[0].hots: unknown key 'hots'; did you mean 'host'?" in err


def test_missing_script(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "plan", TWO_NODE, "nope.py")
    assert code == 2 and "SCRIPT: nope.py: no such file" in err


def test_bad_env_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "plan", "-e", "NOEQUALS", TWO_NODE, TRAIN)
    assert code == 2 and "--env 'NOEQUALS': expected NAME=VALUE" in err


def test_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "check", TWO_NODE, IB)
    assert code == 0 and out.count(": ok:") == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: []\n")
    code, _, err = cli(capsys, "check", TWO_NODE, str(bad))
    assert code == 2 and f"{bad}:1:8: nodes: the node list is empty" in err


def test_schema_is_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "schema")
    schema = json.loads(out)
    assert code == 0 and schema["title"] == "clusterrun inventory"
    assert "nodes" in schema["properties"] and schema["additionalProperties"] is False


def test_shipped_inventories_validate_against_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    from clusterrun.inventory.models import inventory_json_schema

    validator = jsonschema.Draft202012Validator(inventory_json_schema())
    for path in sorted((ROOT / "inventories").glob("*.yaml")):
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, f"{path.name}: {errors}"


def test_local_runs_take_a_free_master_port_unless_one_is_asked_for(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    local = str(ROOT / "inventories" / "localhost.yaml")
    assert main(["plan", "--json", local, TRAIN]) == 0
    port = json.loads(capsys.readouterr().out)["master_port"]
    assert port != 29500  # two runs on one machine must not collide on the default
    assert main(["plan", "--json", "--master-port", "29511", local, TRAIN]) == 0
    assert json.loads(capsys.readouterr().out)["master_port"] == 29511
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text((ROOT / "inventories" / "localhost.yaml").read_text() + "network: {master_port: 29512}\n")
    assert main(["plan", "--json", str(pinned), TRAIN]) == 0
    assert json.loads(capsys.readouterr().out)["master_port"] == 29512
    assert main(["plan", "--json", TWO_NODE, TRAIN]) == 0  # SSH nodes: the inventory's (default) port
    assert json.loads(capsys.readouterr().out)["master_port"] == 29500
