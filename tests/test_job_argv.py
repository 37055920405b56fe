"""The job's command line read as torchrun reads it: clusterrun's options before SCRIPT, the script's after."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from clusterrun.cli.job_argv import moved_options, names_script, split
from clusterrun.cli.main import cli, main
from clusterrun.errors import UsageError

SOURCES = ("--ips", "--hostfile", "--slurm")


def command(name: str = "up") -> click.Command:
    found = cli.get_command(click.Context(cli), name)
    assert found is not None
    return found


def parts(*args: str) -> tuple[list[str], list[str], list[str], bool]:
    return split(command(), list(args), SOURCES)


def test_everything_after_script_is_the_scripts() -> None:
    ours, positionals, script, explicit = parts("--hang-timeout", "60", "c.yaml", "train.py", "--lr", "0.1",
                                                "--timeout", "30", "-q", "--json", "-m", "foo", "~/data")
    assert ours == ["--hang-timeout", "60"] and positionals == ["c.yaml", "train.py"] and not explicit
    assert script == ["--lr", "0.1", "--timeout", "30", "-q", "--json", "-m", "foo", "~/data"]


def test_with_a_node_source_script_is_the_first_positional() -> None:
    ours, positionals, script, _ = parts("--ips", "a,b", "train.py", "c.yaml")
    assert (ours, positionals, script) == (["--ips", "a,b"], ["train.py"], ["c.yaml"])


@pytest.mark.parametrize(("args", "ours"), [
    (("--nproc_per_node", "2"), ["--nproc-per-node", "2"]),
    (("--nproc_per_node=2",), ["--nproc-per-node", "2"]),
    (("--nproc-per-node", "gpu"), []),  # one process per GPU: the default
    (("--nproc_per_node", "auto"), []),
    (("--num_gpus", "4"), ["--nproc-per-node", "4"]),  # DeepSpeed
    (("--master_port", "29600"), ["--master-port", "29600"]),
    (("--devices", "0,1"), ["--gpus", "0,1"]),  # fleetrun
    (("-qm",), ["-q", "-m"]),
    (("-eA=1",), ["-e", "A=1"]),
])
def test_other_launchers_spellings_before_script(args: tuple[str, ...], ours: list[str]) -> None:
    got, positionals, _, _ = parts("--ips", "a,b", *args, "train.py")
    assert got == ["--ips", "a,b", *ours] and positionals == ["train.py"]


@pytest.mark.parametrize("flag", ["--nnodes", "--node_rank", "--master_addr", "--master-addr", "--rdzv_endpoint",
                                  "--standalone"])
def test_what_clusterrun_derives_is_refused_with_the_reason(flag: str) -> None:
    with pytest.raises(UsageError, match=f"{flag}: clusterrun sets this itself; .*; drop it"):
        parts(flag, "2", "c.yaml", "train.py")


def test_an_unknown_option_is_an_error_with_the_nearest_one_not_a_script() -> None:
    with pytest.raises(UsageError, match="no such option: --hang-timout; did you mean --hang-timeout"):
        parts("--hang-timout", "5", "c.yaml", "train.py")
    with pytest.raises(UsageError, match="--quiet takes no value"):
        parts("--quiet=yes", "c.yaml", "train.py")


def test_slurm_takes_a_value_only_when_it_is_not_the_script() -> None:
    assert parts("--slurm", "train.py", "--x")[:3] == (["--slurm", ""], ["train.py"], ["--x"])
    assert parts("--slurm", "gpu[01-02]", "train.py")[:2] == (["--slurm", "gpu[01-02]"], ["train.py"])


def test_double_dash_right_after_script_is_dropped_any_later_one_kept() -> None:
    assert parts("c.yaml", "train.py", "--", "-q", "--", "x")[2:] == (["-q", "--", "x"], True)
    assert parts("--", "c.yaml", "train.py", "-q")[1:] == (["c.yaml", "train.py"], ["-q"], False)


def test_clusterrun_options_after_script_are_pointed_out_but_common_names_are_not() -> None:
    assert moved_options(command(), ["--dry-run", "--hang-timeout=5", "--json", "--timeout", "30", "-q"]) == [
        "--dry-run", "--hang-timeout"]


def run_cli(*argv: str) -> tuple[int, str]:
    """``clusterrun ARGV`` through the real entry point: (exit code, stderr)."""
    with CliRunner().isolation() as streams:
        code = main(list(argv))
    return code, streams[1].getvalue().decode()


def test_script_alone_is_script_and_everything_after_it_the_scripts() -> None:
    # `up --devices=0,1 train.py --lr=0.01` used to take train.py for INVENTORY and --lr for clusterrun's.
    ours, positionals, script, _ = parts("--devices=0,1", "train.py", "--lr=0.01")
    assert (ours, positionals, script) == (["--gpus", "0,1"], ["train.py"], ["--lr=0.01"])
    assert parts("-m", "mypkg.train", "--lr", "1")[1:3] == (["mypkg.train"], ["--lr", "1"])
    assert parts("--", "train.py", "-q")[1:3] == (["train.py"], ["-q"])
    assert parts("c.yaml", "train.py", "--lr", "1")[1:3] == (["c.yaml", "train.py"], ["--lr", "1"])
    assert parts("--", "c.yaml", "train.py", "-q")[1:3] == (["c.yaml", "train.py"], ["-q"])


@pytest.mark.parametrize(("token", "module", "script"), [
    ("train.py", False, True), ("cluster.yaml", False, False), ("cluster", False, False),
    ("mypkg.train", True, True), ("cluster.yml", True, False), ("mypkg.train", False, False),
])
def test_what_names_a_script_rather_than_an_inventory(token: str, module: bool, script: bool) -> None:
    assert names_script(token, module) is script


@pytest.mark.parametrize(("args", "message"), [
    (("--log_dir", "x"), "no such option: --log_dir; clusterrun's equivalent is --runs-dir DIR (every rank's "
                         "output is written to DIR/<run-id>/<node>/rank<R>.log; default ./runs)"),
    (("--master", "1.2.3.4"), "--master: clusterrun sets this itself; the master is rank 0's node on the data "
                              "network: list the node you want first (or pin `node_rank: 0`); --data-nic chooses the "
                              "network, --master-port the port; drop it"),
    (("--npus", "8"), "no such option: --npus; clusterrun's equivalent is --gpus LIST for device indices, "
                      "--nproc-per-node N for a count"),
    (("--rank", "0"), "--rank: clusterrun sets this itself; each node's rank is its place in the node list (the "
                      "first is 0); `node_rank` in the inventory pins ranks; drop it (--ranks LIST shows only some "
                      "ranks' output)"),
    (("--node_rank", "1"), "--node_rank: clusterrun sets this itself; each node's rank is its place"),
    (("--max_restarts=3",), "no such option: --max_restarts; clusterrun's equivalent is --max-restarts N"),
    (("-np", "16"), "no such option: -np; clusterrun's equivalent is --nproc-per-node N (processes on every node"),
    (("-x", "NCCL_DEBUG=INFO"), "no such option: -x; clusterrun's equivalent is -e KEY=VALUE"),
])
def test_other_launchers_flags_get_clusterruns_equivalent(args: tuple[str, ...], message: str) -> None:
    code, err = run_cli("up", *args, "train.py")
    assert code == 2
    assert err.startswith(f"clusterrun: error: {message}"), err
    assert err.count("\n") == 1


def test_commands_without_a_job_explain_foreign_flags_through_clicks_error() -> None:
    code, err = run_cli("doctor", "--nnodes", "2", "--ips", "a")
    assert code == 2 and "Error: --nnodes: clusterrun sets this itself; clusterrun counts the nodes it is given" in err
    code, err = run_cli("doctor", "--devices", "0,1", "--ips", "a")
    assert code == 2 and "Error: no such option: --devices; clusterrun's equivalent is --gpus" in err
    # an equivalent the command does not have is not offered: click's own message stays
    code, err = run_cli("check", "--log_dir", "x", "c.yaml")
    assert code == 2 and "No such option" in err and "--runs-dir" not in err


def test_every_equivalent_in_the_table_is_an_option_of_up() -> None:
    from clusterrun.cli.foreign_flags import ALIASES, EQUIVALENTS, explain
    from clusterrun.cli.job_argv import _options

    options = _options(command())
    assert {target for target in ALIASES.values()} <= set(options)
    assert {option for option, _ in EQUIVALENTS.values()} <= set(options)
    for flag, (_, text) in EQUIVALENTS.items():
        assert explain(flag, options) == f"no such option: {flag}; clusterrun's equivalent is {text}"


def test_exec_refuses_unknown_options_instead_of_running_them_as_the_command() -> None:
    # exec keeps unknown options for the command: before `--` they used to become part of it ("--nnodes 2 -- ls").
    code, err = run_cli("exec", "--nnodes", "2", "--ips", "a", "--", "hostname")
    assert code == 2 and err.startswith("clusterrun: error: --nnodes: clusterrun sets this itself;"), err
    code, err = run_cli("exec", "--devicez", "0", "--ips", "a", "--", "hostname")
    assert code == 2 and err.startswith("clusterrun: error: no such option: --devicez (clusterrun's options go "
                                        "before `--`; the command follows it)"), err
