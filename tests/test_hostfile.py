"""DeepSpeed / OpenMPI hostfiles: the documented examples parse, every bad line is named by file:line."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from clusterrun.errors import InventoryError
from clusterrun.inventory.hostfile import HostfileEntry, parse_hostfile
from clusterrun.inventory.sources import HostSource, load_cluster

DEEPSPEED_README = """\
worker-1 slots=4
worker-2 slots=4
"""

OPENMPI_MAN_PAGE = """\
# This is an example hostfile.  Comments begin with #
#
# The following node is a single processor machine:
foo.example.com

# The following node is a dual-processor machine:
bar.example.com slots=2

# The following node is a quad-processor machine, and we absolutely
# want to disallow over-subscribing it:
yow.example.com slots=4 max-slots=4
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (DEEPSPEED_README, [HostfileEntry("worker-1", 4, 1), HostfileEntry("worker-2", 4, 2)]),
        (
            OPENMPI_MAN_PAGE,
            [
                HostfileEntry("foo.example.com", None, 4),
                HostfileEntry("bar.example.com", 2, 7),
                HostfileEntry("yow.example.com", 4, 11, max_slots=4),
            ],
        ),
        ("worker-1 slots=8 # the big one\n", [HostfileEntry("worker-1", 8, 1)]),
        ("\n\n   \t\n  worker-1   slots=2  \n", [HostfileEntry("worker-1", 2, 4)]),
        ("worker-1\tslots=2\r\nworker-2 slots=2\r\n", [HostfileEntry("worker-1", 2, 1), HostfileEntry("worker-2", 2, 2)]),
        ("worker-1", [HostfileEntry("worker-1", None, 1)]),
        ("worker-1#slots=4", [HostfileEntry("worker-1", None, 1)]),
        ("worker-1 max_slots=6 slots=2", [HostfileEntry("worker-1", 2, 1, max_slots=6)]),
        ("worker-1 slots=04", [HostfileEntry("worker-1", 4, 1)]),
        ("10.0.0.1 slots=8\n10.0.0.2 slots=8", [HostfileEntry("10.0.0.1", 8, 1), HostfileEntry("10.0.0.2", 8, 2)]),
        ("FE80:0::1 slots=1", [HostfileEntry("fe80::1", 1, 1)]),
        ("worker_1 slots=4", [HostfileEntry("worker_1", 4, 1)]),  # Slurm and ssh_config names may hold '_'
    ],
)
def test_parses_documented_hostfiles(text: str, expected: list[HostfileEntry]) -> None:
    assert parse_hostfile(text, "hosts") == expected


@pytest.mark.parametrize(
    ("text", "where", "offending"),
    [
        ("worker-1 slots=four", "hosts:1:", "'slots=four'"),
        ("worker-1 slots=0", "hosts:1:", "'slots=0'"),
        ("worker-1 slots=-2", "hosts:1:", "'slots=-2'"),
        ("worker-1 slots=", "hosts:1:", "'slots='"),
        ("worker-1 slots=4.5", "hosts:1:", "'slots=4.5'"),
        ("worker-1 slots=4 slots=8", "hosts:1:", "slots is given twice"),
        ("worker-1 gpus=4", "hosts:1:", "unknown setting 'gpus=4'"),
        ("worker-1 Slots=4", "hosts:1:", "unknown setting 'Slots=4'"),
        ("\nslots=4", "hosts:2:", "'slots=4' has no host name"),
        ("worker-1 4", "hosts:1:", "unexpected '4'"),
        ("worker-1 worker-2", "hosts:1:", "unexpected 'worker-2'"),
        ("worker-1 slots = 4", "hosts:1:", "'slots = 4': write settings without spaces around '='"),
        ("worker-1 slots= 4", "hosts:1:", "'slots= 4': write settings without spaces around '='"),
        ("-worker slots=4", "hosts:1:", "host '-worker' starts with '-'"),
        ("ml@worker-1 slots=4", "hosts:1:", "host 'ml@worker-1' holds '@'"),
        ("10.0.0.300 slots=4", "hosts:1:", "'10.0.0.300' is not a valid IPv4 address"),
        ("worker-1:2222 slots=4", "hosts:1:", "'worker-1:2222' is not a valid IPv6 address"),
        ("worker-1 slots=4 max_slots=2", "hosts:1:", "max_slots=2 is less than slots=4"),
        ("worker-1 max_slots=0", "hosts:1:", "'max_slots=0'"),
    ],
)
def test_bad_lines_are_named_by_file_and_line(text: str, where: str, offending: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_hostfile(text, "hosts")
    assert str(info.value).startswith(where)
    assert offending in str(info.value)
    assert info.value.problems == (str(info.value),)


def test_duplicate_host_names_both_lines() -> None:
    text = "worker-1 slots=4\n# spare\nworker-2 slots=4\nworker-1 slots=2\n"
    with pytest.raises(InventoryError) as info:
        parse_hostfile(text, "/etc/hosts.ds")
    assert str(info.value) == (
        "/etc/hosts.ds:4: host 'worker-1' is listed again (first at /etc/hosts.ds:1); "
        "list each host once, with all its slots"
    )


def test_duplicate_hosts_differing_only_in_case_are_duplicates() -> None:
    with pytest.raises(InventoryError, match=r"hosts:2: host 'Worker-1' is listed again \(first at hosts:1\)"):
        parse_hostfile("worker-1 slots=1\nWorker-1 slots=1", "hosts")


def test_every_problem_is_reported_at_once() -> None:
    text = "worker-1 slots=four\nworker-2 slots=2\nslots=4\nworker-2 slots=2\nworker-1 slots=1\n"
    with pytest.raises(InventoryError) as info:
        parse_hostfile(text, "hosts")
    assert [p.split(": ", 1)[0] for p in info.value.problems] == ["hosts:1", "hosts:3", "hosts:4", "hosts:5"]
    assert "hosts:5: host 'worker-1' is listed again (first at hosts:1)" in info.value.problems[3]
    assert str(info.value).startswith("hosts: 4 problems\n")
    for problem in info.value.problems:
        assert problem in str(info.value)


@pytest.mark.parametrize("text", ["", "\n\n", "# only comments\n   # indented\n"])
def test_a_file_without_hosts_is_an_error(text: str) -> None:
    with pytest.raises(InventoryError, match=r"^hosts: no hosts found; write one host per line, like 'worker-1 slots=4'"):
        parse_hostfile(text, "hosts")


def test_default_path_is_named_in_errors() -> None:
    with pytest.raises(InventoryError, match=r"^<hostfile>:1: "):
        parse_hostfile("worker-1 slots=x")


def test_entries_are_frozen() -> None:
    entry = parse_hostfile(DEEPSPEED_README)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.slots = 8  # type: ignore[misc]


def test_prrte_exclusion_line_is_refused_with_file_and_line(tmp_path: Path) -> None:
    # PRRTE/OpenMPI's `^node2` (exclude node2) used to become a host named '^node2'.
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n^node2\n")
    with pytest.raises(InventoryError) as info:
        load_cluster(HostSource(hostfile=hostfile), {})
    assert str(info.value) == (f"{hostfile}:3: '^node2': '^' excludes a host in PRRTE/OpenMPI hostfiles; clusterrun "
                               "runs on every host the file lists: delete the line of 'node2' (or comment it out with "
                               "'#'), or pick nodes with --nodes")


@pytest.mark.parametrize("host", ["*", "+node3", "./node3", "~node3"])
def test_a_host_no_host_name_could_be_is_refused_with_file_and_line(tmp_path: Path, host: str) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"node1 slots=2\n{host} slots=2\n")
    with pytest.raises(InventoryError, match=f"^{re.escape(str(hostfile))}:2: host {re.escape(repr(host))} starts "
                       f"with {re.escape(repr(host[0]))}, which no host name does"):
        load_cluster(HostSource(hostfile=hostfile), {})
