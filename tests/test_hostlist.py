"""Slurm hostlist expressions, checked against what ``scontrol show hostnames`` prints."""

from __future__ import annotations

import pytest

from clusterrun.errors import UsageError
from clusterrun.inventory.hostlist import MAX_DIGITS, MAX_HOSTS, compress_hostlist, expand_hostlist
from clusterrun.inventory.hostspec import MAX_HOST_LENGTH


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # Expected values are what `scontrol show hostnames EXPR` prints. First the examples of
        # the Slurm documentation (sbatch/scontrol man pages, Slurm::Hostlist).
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
        ("n[1,3,5-6]", ["n1", "n3", "n5", "n6"]),
        ("n[01-2]", ["n01", "n02"]),  # the lower bound sets the width
        ("n[1-02]", ["n1", "n2"]),
        # Text after the last group is a suffix of every name (Slurm 23.02.5 and later).
        ("gpu[01-04]-ib", ["gpu01-ib", "gpu02-ib", "gpu03-ib", "gpu04-ib"]),
        ("node[1-2].cluster.local", ["node1.cluster.local", "node2.cluster.local"]),
        ("node[0001-0003]-int", ["node0001-int", "node0002-int", "node0003-int"]),  # Slurm's NEWS example
        ("x[1-2]y", ["x1y", "x2y"]),
        ("n[1-2]-ib,m[3-4].x", ["n1-ib", "n2-ib", "m3.x", "m4.x"]),
        ("n1 m[1-2]-x", ["n1", "m1-x", "m2-x"]),
        ("[1-2]-ib", ["1-ib", "2-ib"]),
        ("gpu_[01-02]", ["gpu_01", "gpu_02"]),
        # Several groups: the last varies fastest; with two that is reading order ...
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("rack[0-1]-n[1-2]-ib", ["rack0-n1-ib", "rack0-n2-ib", "rack1-n1-ib", "rack1-n2-ib"]),
        ("n[1-2]-[3-4]", ["n1-3", "n1-4", "n2-3", "n2-4"]),
        ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
        ("n[1-2].a[1-2].b", ["n1.a1.b", "n1.a2.b", "n2.a1.b", "n2.a2.b"]),
        ("a[1-2]b[3-4],c", ["a1b3", "a1b4", "a2b3", "a2b4", "c"]),
        # ... with three or more, the groups before the last go from right to left (slowest first).
        ("r[1-2]c[1-2]n[1,3]", ["r1c1n1", "r1c1n3", "r2c1n1", "r2c1n3", "r1c2n1", "r1c2n3", "r2c2n1", "r2c2n3"]),
        ("a[1-2]b[1-2]c[1-2]-x", ["a1b1c1-x", "a1b1c2-x", "a2b1c1-x", "a2b1c2-x",
                                  "a1b2c1-x", "a1b2c2-x", "a2b2c1-x", "a2b2c2-x"]),
        ("a[1-2]b[1-2]c[1-2]d[1-2]", [
            "a1b1c1d1", "a1b1c1d2", "a2b1c1d1", "a2b1c1d2", "a1b2c1d1", "a1b2c1d2", "a2b2c1d1", "a2b2c1d2",
            "a1b1c2d1", "a1b1c2d2", "a2b1c2d1", "a2b1c2d2", "a1b2c2d1", "a1b2c2d2", "a2b2c2d1", "a2b2c2d2",
        ]),
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
        ("n[1-2]-ib]", "']' without a matching '['", 10),  # Slurm would make n1-ib] n2-ib]
        ("n[1-2]x[3", "'[' is never closed", 8),
        ("a,,b", "empty host name before ','", 3),
        (",a", "empty host name before ','", 1),
        ("a,", "empty host name after ','", 2),
        ("n[0-65536]", f"more than {MAX_HOSTS} hosts", 1),
        ("a[0-999999999]b[0-9]", f"more than {MAX_HOSTS} hosts", 1),
        ("n[0-999999999999999999]", f"more than {MAX_HOSTS} hosts", 1),
        ("n[0-99999999999999999999999]", f"number in '0-99999999999999999999999' has more than {MAX_DIGITS} digits",
         3),
        ("n[1," + "9" * 5000 + "]", f"has more than {MAX_DIGITS} digits", 5),  # no int() of 5000 digits
        ("n[" + "0" * 300 + "1]", f"names of 302 characters, more than the {MAX_HOST_LENGTH}", 1),
        ("x" * 254, f"names of 254 characters, more than the {MAX_HOST_LENGTH}", 1),
        ("x,n[1-65536]", f"more than {MAX_HOSTS} hosts", 3),
        ("n[0-99999999]-ib", f"more than {MAX_HOSTS} hosts", 1),
        ("a[0-300]b[0-300]", f"more than {MAX_HOSTS} hosts", 1),  # Slurm bounds each range only
        ("n[1-40000],m[1-40000]", f"more than {MAX_HOSTS} hosts", 12),  # the name that crosses the limit
    ],
)
def test_expand_rejects_with_flag_expression_and_position(expr: str, problem: str, position: int | None) -> None:
    with pytest.raises(UsageError) as info:
        expand_hostlist(expr)
    message = str(info.value)
    assert message.startswith("--slurm: ")
    assert repr(expr) in message or len(expr) > 120
    assert problem in message
    assert len(message) < 400
    if position is not None:
        assert f"at position {position};" in message


def test_expand_names_the_given_source_in_errors() -> None:
    with pytest.raises(UsageError, match=r"^SLURM_JOB_NODELIST: invalid hostlist 'n\[5-3\]'"):
        expand_hostlist("n[5-3]", flag="SLURM_JOB_NODELIST")


@pytest.mark.parametrize(
    ("expr", "total"),
    [("n[0-99999999]", 100_000_000), ("a[0-999999999]b[0-9]", 10_000_000_000), ("x,n[0-99999]", 100_001)],
)
def test_expand_refuses_a_huge_list_before_making_any_name(expr: str, total: int) -> None:
    # The count is exact and known before expanding, so the error costs no memory.
    with pytest.raises(UsageError) as info:
        expand_hostlist(expr)
    message = str(info.value)
    assert f"expands to {total} hosts, more than {MAX_HOSTS} hosts (the limit)" in message
    assert message.endswith("check the range bounds for a typo")
    assert "\n" not in message


def test_expand_refuses_thousands_of_groups_quickly() -> None:
    with pytest.raises(UsageError, match=f"expands to over 10\\^{MAX_DIGITS} hosts"):
        expand_hostlist("n" + "[0-999999999999999999]" * 5000)


def test_error_in_a_long_node_list_shows_the_part_around_the_problem() -> None:
    nodelist = ",".join(f"gpu{i:04d}" for i in range(400)) + ",gpu[05-03]," + ",".join(f"cpu{i}" for i in range(50))
    with pytest.raises(UsageError) as info:
        expand_hostlist(nodelist, flag="SLURM_JOB_NODELIST")
    message = str(info.value)
    assert message.startswith("SLURM_JOB_NODELIST: invalid hostlist ...'")
    assert "gpu[05-03]" in message
    assert f"({len(nodelist)} characters): reversed range '05-03' at position {nodelist.index('[05-03]') + 2};" in message
    assert message.endswith("write it as 03-05")
    assert len(message) < 250


def test_cluster_ipmi_range_keeps_its_suffix() -> None:
    hosts = expand_hostlist("cluster[50-99]-ipmi")
    assert len(hosts) == 50
    assert hosts[:2] == ["cluster50-ipmi", "cluster51-ipmi"]
    assert hosts[-1] == "cluster99-ipmi"


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
        # the text after the last number becomes a suffix
        (["gpu01-ib", "gpu02-ib", "gpu03-ib", "gpu04-ib"], "gpu[01-04]-ib"),
        (["node1.cluster.local", "node2.cluster.local"], "node[1-2].cluster.local"),
        (["rack0-n1-ib", "rack0-n2-ib", "rack1-n1-ib"], "rack0-n[1-2]-ib,rack1-n1-ib"),
        (["n1-ib", "n2", "n3"], "n1-ib,n[2-3]"),
        (["n1-ib", "n2-eth"], "n1-ib,n2-eth"),
        (["gpu_01", "gpu_02"], "gpu_[01-02]"),
        (["1a", "2a"], "[1-2]a"),
    ],
)
def test_compress_writes_compact_hostlists(names: list[str], expected: str) -> None:
    assert compress_hostlist(names) == expected
    if names:
        assert expand_hostlist(expected) == names


@pytest.mark.parametrize(
    "expr",
    ["tux[0-3,5]", "rack[01-2]-node[01-2,5]", "n[098-101],login,n[7,3,003]", "a,b[1-3],c", "x[1-3],x[2-4]",
     "gpu[01-04]-ib,gpu[01-04]", "r[1-2]c[1-2]n[1,3]-ib", "node[9-11].cluster.local"],
)
def test_compress_then_expand_round_trips(expr: str) -> None:
    names = expand_hostlist(expr)
    assert expand_hostlist(compress_hostlist(names)) == names


@pytest.mark.parametrize("bad", ["", "n[1]", "a,b", "a b", "x]"])
def test_compress_rejects_names_no_hostlist_can_hold(bad: str) -> None:
    with pytest.raises(ValueError, match="cannot write"):
        compress_hostlist(["ok1", bad])
