"""Slurm hostlist expressions, checked against what ``scontrol show hostnames`` prints."""

from __future__ import annotations

import pytest

from clusterrun.errors import UsageError
from clusterrun.inventory.hostlist import MAX_HOSTS, compress_hostlist, expand_hostlist


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # Examples from the Slurm documentation (sbatch/scontrol man pages, Slurm::Hostlist).
        ("tux[0-3,5]", ["tux0", "tux1", "tux2", "tux3", "tux5"]),
        ("lx[10-12]", ["lx10", "lx11", "lx12"]),
        ("node1,node[2-5,12]", ["node1", "node2", "node3", "node4", "node5", "node12"]),
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("n[005,4]", ["n005", "n4"]),  # padding belongs to each range, not the group
        ("n[5]", ["n5"]),
        ("n[007]", ["n007"]),
        ("n[0-0]", ["n0"]),
        ("a,b[1-3],c", ["a", "b1", "b2", "b3", "c"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("r[1-2]c[1-2]n[1,3]", ["r1c1n1", "r1c1n3", "r1c2n1", "r1c2n3", "r2c1n1", "r2c1n3", "r2c2n1", "r2c2n3"]),
        ("rack[01-2]-node[01-2,5]", [  # the python-hostlist docs' example
            "rack01-node01", "rack01-node02", "rack01-node5",
            "rack02-node01", "rack02-node02", "rack02-node5",
        ]),
        ("10.0.0.[1-3]", ["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        ("[1-2]", ["1", "2"]),
        ("gpu-a100-[1-2]", ["gpu-a100-1", "gpu-a100-2"]),
        ("n[3,1,2]", ["n3", "n1", "n2"]),  # order as written, not sorted
        ("n1,n1", ["n1", "n1"]),  # duplicates kept, as scontrol does
        ("n[1-2],n[2-3]", ["n1", "n2", "n2", "n3"]),
        ("login", ["login"]),
        ("a b\tc", ["a", "b", "c"]),  # Slurm also separates names by whitespace
        ("  n[1-2] , m1  ", ["n1", "n2", "m1"]),
        ("n[1-2] m[1-2]", ["n1", "n2", "m1", "m2"]),
    ],
)
def test_expand_matches_scontrol_show_hostnames(expr: str, expected: list[str]) -> None:
    assert expand_hostlist(expr) == expected


@pytest.mark.parametrize(
    ("expr", "problem", "position"),
    [
        ("", "empty hostlist", None),
        ("   ", "empty hostlist", None),
        ("gpu[01-04", "'[' is never closed", 4),
        ("gpu01-04]", "']' without a matching '['", 9),
        ("n[1-2]]", "']' without a matching '['", 7),
        ("n[1[2]]", "nested '['", 4),
        ("n[]", "empty range", 3),
        ("n[1,,3]", "empty range", 5),
        ("n[1,]", "empty range", 5),
        ("n[5-]", "'5-' is missing a bound", 3),
        ("n[-3]", "'-3' is missing a bound", 3),
        ("n[5-3]", "reversed range '5-3'", 3),
        ("n[1,10-08]", "reversed range '10-08'", 5),
        ("n[a-c]", "non-numeric range 'a-c'", 3),
        ("n[1-3:2]", "non-numeric range '1-3:2'", 3),  # no strides
        ("n[1-2-3]", "non-numeric range '1-2-3'", 3),
        ("n[ 1]", "non-numeric range ' 1'", 3),
        ("n[+1]", "non-numeric range '+1'", 3),
        ("n[1-2]-ib", "text '-ib' after the last ']'", 7),
        ("a,,b", "empty host name before ','", 3),
        (",a", "empty host name before ','", 1),
        ("a,", "empty host name after ','", 2),
        ("n[0-65536]", f"more than {MAX_HOSTS} hosts", 1),
        ("a[0-999999999]b[0-9]", f"more than {MAX_HOSTS} hosts", 1),
        ("n[0-99999999999999999999999]", f"more than {MAX_HOSTS} hosts", 1),
        ("x,n[1-65536]", f"more than {MAX_HOSTS} hosts", 3),
    ],
)
def test_expand_rejects_with_flag_expression_and_position(expr: str, problem: str, position: int | None) -> None:
    with pytest.raises(UsageError) as info:
        expand_hostlist(expr)
    message = str(info.value)
    assert message.startswith("--slurm: ")
    assert repr(expr) in message
    assert problem in message
    if position is not None:
        assert f"at position {position};" in message


def test_expand_names_the_given_source_in_errors() -> None:
    with pytest.raises(UsageError, match=r"^SLURM_JOB_NODELIST: invalid hostlist 'n\[5-3\]'"):
        expand_hostlist("n[5-3]", flag="SLURM_JOB_NODELIST")


def test_expand_accepts_exactly_the_host_limit() -> None:
    hosts = expand_hostlist(f"n[1-{MAX_HOSTS}]")
    assert len(hosts) == MAX_HOSTS
    assert hosts[-1] == f"n{MAX_HOSTS}"


def test_reversed_range_error_shows_the_fix() -> None:
    with pytest.raises(UsageError, match="write it as 03-05"):
        expand_hostlist("gpu[05-03]")


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ([], ""),
        (["n5"], "n5"),
        (["login"], "login"),
        (["tux0", "tux1", "tux2", "tux3", "tux5"], "tux[0-3,5]"),
        (["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"], "gpu[01-04,07]"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["n08", "n09", "n10", "n11"], "n[08-11]"),
        (["n08", "n9"], "n[08,9]"),  # n[08-09] would print n09
        (["n005", "n4"], "n[005,4]"),
        (["a", "b1", "b2", "b3", "c"], "a,b[1-3],c"),
        (["n3", "n1", "n2"], "n[3,1-2]"),
        (["n1", "n1"], "n[1,1]"),
        (["n1", "m1", "n2"], "n1,m1,n2"),
        (["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"], "rack1-n[1-2],rack2-n[1-2]"),
        (["10.0.0.1", "10.0.0.2", "10.0.0.3"], "10.0.0.[1-3]"),
        (["1", "2"], "[1-2]"),
    ],
)
def test_compress_writes_compact_hostlists(names: list[str], expected: str) -> None:
    assert compress_hostlist(names) == expected
    if names:
        assert expand_hostlist(expected) == names


@pytest.mark.parametrize(
    "expr",
    ["tux[0-3,5]", "rack[01-2]-node[01-2,5]", "n[098-101],login,n[7,3,003]", "a,b[1-3],c", "x[1-3],x[2-4]"],
)
def test_compress_then_expand_round_trips(expr: str) -> None:
    names = expand_hostlist(expr)
    assert expand_hostlist(compress_hostlist(names)) == names


@pytest.mark.parametrize("bad", ["", "n[1]", "a,b", "a b", "x]"])
def test_compress_rejects_names_no_hostlist_can_hold(bad: str) -> None:
    with pytest.raises(ValueError, match="cannot write"):
        compress_hostlist(["ok1", bad])
