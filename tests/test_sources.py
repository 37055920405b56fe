"""Node sources: INVENTORY files and one-liners (--ips, --hostfile, --slurm) build the same validated Inventory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clusterrun.errors import InventoryError, UsageError
from clusterrun.inventory.models import Inventory, Transport
from clusterrun.inventory.sources import HostSource, describe, load_cluster, select_nodes
from clusterrun.inventory.yaml_source import load_inventory, parse_inventory_text

FOUR_NODE = Path(__file__).resolve().parent.parent / "inventories" / "four-node-infiniband.yaml"
NO_ENV: dict[str, str] = {}


def nodes_of(inv: Inventory) -> list[tuple[str, str, int | None, list[int], int | None]]:
    """(name, host, ssh port, gpus, nproc_per_node) of every node."""
    return [(n.name, n.host, n.ssh.port, list(n.gpus), n.nproc_per_node) for n in inv.nodes]


def revalidated(inv: Inventory) -> Inventory:
    """The inventory passed through validation again, as if written to a file and read back."""
    return Inventory.model_validate(inv.model_dump())


# --- --ips -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ips", "expected"),
    [
        ("10.0.0.1,10.0.0.2", [("10.0.0.1", "10.0.0.1", None, [], None), ("10.0.0.2", "10.0.0.2", None, [], None)]),
        ("gpu-01,gpu-02:2222", [("gpu-01", "gpu-01", None, [], None), ("gpu-02", "gpu-02", 2222, [], None)]),
        ("gpu-01.cluster.local:22", [("gpu-01.cluster.local", "gpu-01.cluster.local", 22, [], None)]),
        # Slurm node names and ssh_config aliases with underscores name their nodes as they are
        ("gpu_01,rack0_blade2:2222", [("gpu_01", "gpu_01", None, [], None),
                                      ("rack0_blade2", "rack0_blade2", 2222, [], None)]),
        # IPv6: the host is kept, the name is derived (':' is not allowed in node names)
        ("[fe80::1]:2222,FE80:0::2", [("fe80--1", "fe80::1", 2222, [], None), ("fe80--2", "fe80::2", None, [], None)]),
        ("::1", [("node--1", "::1", None, [], None)]),
        # one host on several ports: several nodes, named after host and port
        ("localhost:2201,localhost:2202",
         [("localhost-2201", "localhost", 2201, [], None), ("localhost-2202", "localhost", 2202, [], None)]),
        # a host name longer than a node name may be
        ("a" * 60 + ".example.org", [("a" * 60 + ".ex", "a" * 60 + ".example.org", None, [], None)]),
    ],
)
def test_ips_nodes(ips: str, expected: list[tuple[Any, ...]]) -> None:
    inv = load_cluster(HostSource(ips=ips), NO_ENV)
    assert nodes_of(inv) == expected
    assert inv.defaults.transport is Transport.ssh
    assert all(not n.nics for n in inv.nodes)
    assert inv.network.data == "auto"
    assert revalidated(inv) == inv


def test_derived_names_stay_unique() -> None:
    # 'fe80--1' is also a valid host name: the derived name for fe80::1 must not collide with it
    inv = load_cluster(HostSource(ips="fe80--1,fe80::1"), NO_ENV)
    assert [(n.name, n.host) for n in inv.nodes] == [("fe80--1", "fe80--1"), ("fe80--1-2", "fe80::1")]


def test_one_liner_flags_fill_defaults_and_network() -> None:
    src = HostSource(ips="gpu-01,gpu-02:2222", gpus="0-1,4-5", nproc_per_node=4, ssh_user="ml",
                     python="/opt/torch/bin/python", data_nic="10.20.0.7/16")
    inv = load_cluster(src, NO_ENV)
    assert nodes_of(inv) == [("gpu-01", "gpu-01", None, [0, 1, 4, 5], None),
                             ("gpu-02", "gpu-02", 2222, [0, 1, 4, 5], None)]
    assert inv.defaults.nproc_per_node == 4
    assert inv.defaults.ssh.user == "ml"
    assert inv.defaults.python == "/opt/torch/bin/python"
    assert inv.network.data == "10.20.0.0/16"
    assert inv.ssh_of(inv.nodes[1]).port == 2222
    assert inv.ssh_of(inv.nodes[1]).user == "ml"
    assert revalidated(inv) == inv


@pytest.mark.parametrize(("data_nic", "expected"), [("eth1", "eth1"), ("enp65s0f0", "enp65s0f0"),
                                                    ("auto", "auto"), ("10.0.0.0/24", "10.0.0.0/24"),
                                                    ("192.168.1.9/16", "192.168.0.0/16"), ("fd00::1/64", "fd00::/64")])
def test_data_nic_name_or_subnet(data_nic: str, expected: str) -> None:
    assert load_cluster(HostSource(ips="n1", data_nic=data_nic), NO_ENV).network.data == expected


@pytest.mark.parametrize(
    ("src", "flag", "fragment"),
    [
        (HostSource(ips=""), "--ips", "no hosts given"),
        (HostSource(ips="gpu-01,,gpu-02"), "--ips", "item 2"),
        (HostSource(ips="gpu-01,gpu-02,GPU-01"), "--ips", "items 1 and 3"),
        (HostSource(ips="-gpu01"), "--ips", "host '-gpu01' starts with '-'"),
        (HostSource(ips="gpu-01:99999"), "--ips", "out of range"),
        (HostSource(ips="n1", gpus="3-1"), "--gpus", "reversed range"),
        (HostSource(ips="n1", gpus="0,0"), "--gpus", "given twice"),
        (HostSource(ips="n1", gpus="2000"), "--gpus", "above 1023"),
        (HostSource(ips="n1", nproc_per_node=0), "--nproc-per-node", "greater than or equal to 1, got 0"),
        (HostSource(ips="n1", nproc_per_node=5000), "--nproc-per-node", "less than or equal to 1024"),
        (HostSource(ips="n1", data_nic="eth:1"), "--data-nic", "network interface name"),
        (HostSource(ips="n1", data_nic="10.0.0.300/24"), "--data-nic", "subnet like '10.0.0.0/24'"),
        (HostSource(ips="n1", data_nic="a-very-long-interface-name"), "--data-nic", "network interface name"),
        (HostSource(ips="n1", ssh_user="my user"), "--ssh-user", "'my user'"),
        (HostSource(ips="n1", ssh_user=""), "--ssh-user", "user name"),
        (HostSource(ips="n1", python="  "), "--python", "interpreter"),
    ],
)
def test_one_liner_errors_name_the_flag(src: HostSource, flag: str, fragment: str) -> None:
    with pytest.raises(UsageError) as err:
        load_cluster(src, NO_ENV)
    assert str(err.value).startswith(flag)
    assert fragment in str(err.value)


# --- --hostfile ------------------------------------------------------------------------------------------------

HOSTFILE = """\
# DeepSpeed-style hostfile
worker-1 slots=4

worker-2 slots=2   # the small one
10.0.0.3
"""


def write(tmp_path: Path, text: str, name: str = "hostfile") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_hostfile_slots_become_nproc(tmp_path: Path) -> None:
    inv = load_cluster(HostSource(hostfile=write(tmp_path, HOSTFILE), gpus="0-3"), NO_ENV)
    assert nodes_of(inv) == [("worker-1", "worker-1", None, [0, 1, 2, 3], 4),
                             ("worker-2", "worker-2", None, [0, 1, 2, 3], 2),
                             ("10.0.0.3", "10.0.0.3", None, [0, 1, 2, 3], None)]
    assert inv.defaults.nproc_per_node is None
    assert revalidated(inv) == inv


def test_nproc_per_node_wins_over_slots(tmp_path: Path) -> None:
    inv = load_cluster(HostSource(hostfile=write(tmp_path, HOSTFILE), nproc_per_node=1), NO_ENV)
    assert [n.nproc_per_node for n in inv.nodes] == [None, None, None]
    assert inv.defaults.nproc_per_node == 1


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("worker-1 slots=4\nworker-1 slots=4\n", "hostfile:2: host 'worker-1' is listed again (first at"),
        ("worker-1 slots=0\n", "hostfile:1:"),
        ("# only comments\n\n", "no hosts found"),
    ],
)
def test_hostfile_errors_name_file_and_line(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as err:
        load_cluster(HostSource(hostfile=path), NO_ENV)
    assert str(err.value).startswith(str(path))
    assert fragment in str(err.value)


def test_hostfile_slots_are_validated_like_nproc_per_node(tmp_path: Path) -> None:
    path = write(tmp_path, "worker-1 slots=2\nworker-2 slots=2000\n")
    with pytest.raises(InventoryError) as err:
        load_cluster(HostSource(hostfile=path), NO_ENV)
    assert str(err.value).startswith(f"{path}:2: 'slots=2000': slots is more than 1024")


def test_missing_hostfile(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="no such hostfile"):
        load_cluster(HostSource(hostfile=tmp_path / "nope"), NO_ENV)


# --- --slurm ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slurm", "environ", "names"),
    [
        ("gpu[01-03]", NO_ENV, ["gpu01", "gpu02", "gpu03"]),
        ("login,rack[1-2]-n[1-2]", NO_ENV, ["login", "rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("gpu[01-02]-ib,node[1-2].cluster.local", NO_ENV,
         ["gpu01-ib", "gpu02-ib", "node1.cluster.local", "node2.cluster.local"]),
        ("", {"SLURM_JOB_NODELIST": "gpu_[01-02]"}, ["gpu_01", "gpu_02"]),
        ("gpu[01-02]", {"SLURM_JOB_NODELIST": "other[1-4]"}, ["gpu01", "gpu02"]),  # an explicit list wins
        ("", {"SLURM_JOB_NODELIST": "n[08-10]"}, ["n08", "n09", "n10"]),
        ("", {"SLURM_JOB_NODELIST": "a,b"}, ["a", "b"]),
    ],
)
def test_slurm_nodes(slurm: str, environ: dict[str, str], names: list[str]) -> None:
    inv = load_cluster(HostSource(slurm=slurm, gpus="0-7"), environ)
    assert [(n.name, n.host, n.ssh.port, n.gpus) for n in inv.nodes] == [(h, h, None, list(range(8))) for h in names]
    assert revalidated(inv) == inv


@pytest.mark.parametrize(
    ("slurm", "environ", "fragment"),
    [
        ("", NO_ENV, "SLURM_JOB_NODELIST, which is not set: run inside a Slurm allocation"),
        ("", {"SLURM_JOB_NODELIST": " "}, "or pass the node list"),
        ("", {"SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST: invalid hostlist"),
        ("gpu[02-01]", NO_ENV, "--slurm: invalid hostlist 'gpu[02-01]': reversed range"),
        ("gpu[01-03],gpu02", NO_ENV, "--slurm: host 'gpu02' is listed twice in 'gpu[01-03],gpu02' (hosts 2 and 4"),
        ("-n[1-2]", NO_ENV, "--slurm: host '-n1' starts with '-', which ssh would read as an option"),
        ("n[0-99999999]", NO_ENV, "--slurm: invalid hostlist 'n[0-99999999]': expands to 100000000 hosts"),
    ],
)
def test_slurm_errors(slurm: str, environ: dict[str, str], fragment: str) -> None:
    with pytest.raises(UsageError) as err:
        load_cluster(HostSource(slurm=slurm), environ)
    assert fragment in str(err.value)


# --- choosing a source -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "fragments"),
    [
        (HostSource(), ["no nodes given", "--ips", "--hostfile", "--slurm"]),
        (HostSource(gpus="0", nodes="gpu*"), ["no nodes given"]),
        (HostSource(ips="a", slurm=""), ["--ips and --slurm both name the nodes", "exactly one"]),
        (HostSource(inventory=FOUR_NODE, hostfile=Path("h")), ["four-node-infiniband.yaml) and --hostfile both"]),
        (HostSource(inventory=FOUR_NODE, ips="a", hostfile=Path("h"), slurm="b"),
         ["--ips, --hostfile and --slurm all name the nodes"]),
    ],
)
def test_exactly_one_source(src: HostSource, fragments: list[str]) -> None:
    with pytest.raises(UsageError) as err:
        load_cluster(src, NO_ENV)
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"gpus": "0-3"}, ["--gpus only apply", "each node's gpus"]),
        ({"ssh_user": "ml"}, ["--ssh-user", "defaults.ssh.user"]),
        ({"python": "/usr/bin/python3"}, ["--python", "defaults.python"]),
        ({"data_nic": "ib0"}, ["--data-nic", "network.data"]),
        ({"gpus": "0", "data_nic": "ib0"}, ["--gpus, --data-nic only apply", "set them in"]),
    ],
)
def test_one_liner_flags_refused_with_a_file(overrides: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(UsageError) as err:
        load_cluster(HostSource(inventory=FOUR_NODE, **overrides), NO_ENV)
    for fragment in [*fragments, str(FOUR_NODE)]:
        assert fragment in str(err.value)


def test_inventory_file_is_loaded_as_is() -> None:
    inv = load_cluster(HostSource(inventory=FOUR_NODE), NO_ENV)
    assert inv == load_inventory(FOUR_NODE)
    # --nproc-per-node is a job setting: it does not rewrite the file's inventory
    assert load_cluster(HostSource(inventory=FOUR_NODE, nproc_per_node=2), NO_ENV) == inv


def test_inventory_file_errors_pass_through(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="no such inventory file"):
        load_cluster(HostSource(inventory=tmp_path / "missing.yaml"), NO_ENV)


# --- --nodes ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("ib*", ["ib01", "ib02", "ib03", "ib04"]),
        ("ib0?", ["ib01", "ib02", "ib03", "ib04"]),
        ("ib02", ["ib02"]),
        ("ib0[1-2]", ["ib01", "ib02"]),
        ("ib0[1,3]", ["ib01", "ib03"]),
        ("ib0[1,3],ib04", ["ib01", "ib03", "ib04"]),
        ("label=rack2", ["ib03", "ib04"]),
        ("ib04, label=rack1", ["ib01", "ib02", "ib04"]),  # inventory order, not pattern order
        ("ib01,ib0[1-2],ib*1", ["ib01", "ib02"]),  # the union
        ("ib0[34]*", ["ib03", "ib04"]),  # brackets with '*' are a glob character class
    ],
)
def test_nodes_selects_from_a_file(pattern: str, names: list[str]) -> None:
    inv = load_cluster(HostSource(inventory=FOUR_NODE, nodes=pattern), NO_ENV)
    assert [n.name for n in inv.nodes] == names
    full = load_inventory(FOUR_NODE)
    assert inv.defaults == full.defaults and inv.network == full.network
    assert all(n == next(f for f in full.nodes if f.name == n.name) for n in inv.nodes)


def test_nodes_selects_from_a_one_liner() -> None:
    src = HostSource(ips="gpu01,gpu02:2222,gpu03,cpu01", gpus="0,1", nodes="gpu0[2-3]")
    inv = load_cluster(src, NO_ENV)
    assert nodes_of(inv) == [("gpu02", "gpu02", 2222, [0, 1], None), ("gpu03", "gpu03", None, [0, 1], None)]
    assert [n.name for n in load_cluster(HostSource(slurm="n[1-9]", nodes="n[2-3],n9"), NO_ENV).nodes] == [
        "n2", "n3", "n9"]


@pytest.mark.parametrize(
    ("pattern", "fragments"),
    [
        ("gpu*", ["--nodes: 'gpu*' selects no node", "nodes: ib[01-04]", "labels: rack1, rack2"]),
        ("ib01,ib99", ["'ib99' selects no node"]),
        ("label=rack9", ["'label=rack9' selects no node", "labels: rack1, rack2"]),
        ("ib0[4-5]", ["ib05 (from 'ib0[4-5]') is not in the nodes", "nodes: ib[01-04]"]),
        ("ib0[5-6]", ["ib05, ib06 (from 'ib0[5-6]') are not in the nodes"]),
        ("ib0[2-1]", ["--nodes: invalid hostlist 'ib0[2-1]': reversed range"]),
        ("rack=rack1", ["'rack=rack1' is not a selector", "label=VALUE"]),
        ("label=", ["'label=' is not a selector"]),
        ("ib01,,ib02", ["empty term"]),
        ("", ["empty term"]),
    ],
)
def test_nodes_errors_list_what_there_is(pattern: str, fragments: list[str]) -> None:
    with pytest.raises(UsageError) as err:
        load_cluster(HostSource(inventory=FOUR_NODE, nodes=pattern), NO_ENV)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_select_nodes_names_its_flag() -> None:
    with pytest.raises(UsageError, match=r"^--only: 'x' selects no node"):
        select_nodes(load_inventory(FOUR_NODE), "x", flag="--only")


PINNED = """\
nodes:
  - {name: a, host: a, node_rank: 2}
  - {name: b, host: b, node_rank: 0}
  - {name: c, host: c, node_rank: 1, labels: [x]}
"""


def test_selection_that_removes_nodes_clears_rank_pins() -> None:
    inv = parse_inventory_text(PINNED)
    assert select_nodes(inv, "a,b,c") == inv  # nothing removed: pins kept
    subset = select_nodes(inv, "a,label=x")
    assert [(n.name, n.node_rank, n.labels) for n in subset.nodes] == [("a", None, []), ("c", None, ["x"])]


# --- describe --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "environ", "text"),
    [
        (HostSource(ips="10.0.0.1,10.0.0.2"), NO_ENV, "--ips: 2 nodes"),
        (HostSource(ips="10.0.0.1"), NO_ENV, "--ips: 1 node"),
        (HostSource(inventory=FOUR_NODE, nodes="ib0[1-2]"), NO_ENV, f"{FOUR_NODE}: 4 nodes (--nodes ib0[1-2]: 2)"),
        (HostSource(slurm="n[1-3]"), NO_ENV, "--slurm: 3 nodes"),
        (HostSource(slurm=""), {"SLURM_JOB_NODELIST": "n[1-3]"}, "SLURM_JOB_NODELIST: 3 nodes"),
    ],
)
def test_describe(src: HostSource, environ: dict[str, str], text: str) -> None:
    assert describe(src, environ) == text


def test_describe_hostfile(tmp_path: Path) -> None:
    path = write(tmp_path, HOSTFILE)
    expected = f"--hostfile {path}: 3 nodes (--nodes worker-*: 2)"
    assert describe(HostSource(hostfile=path, nodes="worker-*"), NO_ENV) == expected


# --- SCRIPT alone: this machine ---------------------------------------------------------------------------------


def test_script_alone_is_this_machine_like_the_local_inventory() -> None:
    inv = load_cluster(HostSource(local=True, gpus="0,1", nproc_per_node=2), NO_ENV)
    assert nodes_of(inv) == [("localhost", "127.0.0.1", None, [0, 1], None)]
    assert inv.transport_of(inv.nodes[0]) is Transport.local and inv.defaults.nproc_per_node == 2
    assert describe(HostSource(local=True), NO_ENV) == "this machine: 1 node"
    assert revalidated(inv) == inv


def test_script_alone_refuses_what_only_applies_to_remote_nodes() -> None:
    with pytest.raises(UsageError, match=r"^--ssh-user, --transport only apply to remote nodes; SCRIPT alone runs on "
                       "this machine without SSH"):
        load_cluster(HostSource(local=True, ssh_user="ops", transport="ssh"), NO_ENV)


def test_a_node_source_wins_over_this_machine() -> None:
    inv = load_cluster(HostSource(local=True, ips="10.0.0.1"), NO_ENV)
    assert nodes_of(inv)[0][:2] == ("10.0.0.1", "10.0.0.1")
