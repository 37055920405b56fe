"""The job's command line read as torchrun reads it: clusterrun's options before SCRIPT, the script's after."""

from __future__ import annotations

import click
import pytest

from clusterrun.cli.job_argv import moved_options, split
from clusterrun.cli.main import cli
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
    with pytest.raises(UsageError, match=f"{flag}: clusterrun sets this itself; "):
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
