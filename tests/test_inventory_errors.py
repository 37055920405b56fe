"""Every class of bad inventory gives ``file:line:col: path: message``, and loading writes nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from clusterrun.errors import InventoryError
from clusterrun.inventory.yaml_source import load_inventory, parse_inventory_text


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def problems(tmp_path: Path, text: str) -> tuple[str, ...]:
    path = write(tmp_path, text)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "loading an inventory must not write files"
    return tuple(p.replace(str(path), "inventory.yaml") for p in info.value.problems)


CASES = {
    "yaml syntax": (
        """
        nodes:
          - name: a
            host: "10.0.0.1
        """,
        "inventory.yaml:4:1: invalid YAML: found unexpected end of stream",
    ),
    "unknown key with suggestion": (
        """
        nodes:
          - name: a
            host: h
            gpu: 4
        """,
        "inventory.yaml:4:5: nodes[0].gpu: unknown key 'gpu'; did you mean 'gpus'?",
    ),
    "unknown top-level key": (
        """
        version: 1
        node:
          - {name: a, host: h}
        """,
        "inventory.yaml:2:1: node: unknown key 'node'; did you mean 'nodes'?",
    ),
    "wrong type": (
        """
        nodes:
          - name: a
            host: h
            gpus: lots
        """,
        "inventory.yaml:4:11: nodes[0].gpus: input should be a valid list, got 'lots'",
    ),
    "duplicate yaml key": (
        """
        nodes:
          - name: a
            host: h
            host: g
        """,
        "inventory.yaml:4:5: nodes[0].host: duplicate key 'host' (first at line 3); "
        "YAML would silently keep only the last one",
    ),
    "duplicate node name": (
        """
        nodes:
          - name: a
            host: h
          - name: a
            host: g
        """,
        "inventory.yaml:4:11: nodes[1].name: duplicate node name 'a' (also nodes[0])",
    ),
    "duplicate host": (
        """
        nodes:
          - name: a
            host: h
          - name: b
            host: h
        """,
        "inventory.yaml:5:11: nodes[1].host: duplicate host 'h' (also nodes[0])",
    ),
    "invalid ip": (
        """
        nodes:
          - name: a
            host: h
            nics:
              - {name: eth0, ip: 10.0.0.300/24}
        """,
        "inventory.yaml:5:26: nodes[0].nics[0].ip: expected an IP address like '10.0.0.1' or '10.0.0.1/24', "
        "got '10.0.0.300/24'",
    ),
    "invalid cidr": (
        """
        network:
          data: 10.0.0.0/33
        nodes:
          - {name: a, host: h}
        """,
        "inventory.yaml:2:9: network.data: expected 'auto', a NIC name or a subnet like '10.0.0.0/24', "
        "got '10.0.0.0/33'",
    ),
    "repeated gpu index": (
        """
        nodes:
          - name: a
            host: h
            gpus: [0, 1, 1]
        """,
        "inventory.yaml:4:18: nodes[0].gpus[2]: GPU index 1 is listed twice",
    ),
    "empty node list": (
        """
        nodes: []
        """,
        "inventory.yaml:1:8: nodes: the node list is empty: list at least one node",
    ),
    "data subnet missing on a node": (
        """
        network:
          data: 10.0.0.0/24
        nodes:
          - name: a
            host: h
            nics:
              - {name: eth1, ip: 10.0.0.1/24}
          - name: b
            host: g
            nics:
              - {name: eth1, ip: 10.0.1.2/24}
        """,
        "inventory.yaml:11:7: nodes[1].nics: node 'b' has no NIC in the data subnet 10.0.0.0/24 "
        "(it has: eth1 10.0.1.2/24)",
    ),
    "infiniband nic without hca": (
        """
        nodes:
          - name: a
            host: h
            nics:
              - name: ib0
                ip: 10.0.0.1/24
                kind: infiniband
        """,
        "inventory.yaml:5:9: nodes[0].nics[0]: infiniband NICs need 'hca' (the RDMA device, e.g. mlx5_0",
    ),
    "bad rate": (
        """
        nodes:
          - name: a
            host: h
            nics:
              - name: eth0
                speed: fast
        """,
        "inventory.yaml:6:16: nodes[0].nics[0].speed: expected a rate like '100gbit', got 'fast'",
    ),
    "not a mapping": (
        """
        - a
        - b
        """,
        "inventory.yaml:1:1: expected a mapping with 'nodes:' at the top level",
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_inventory_points_at_the_place(tmp_path: Path, case: str) -> None:
    text, expected = CASES[case]
    found = problems(tmp_path, text)
    assert any(p.startswith(expected) for p in found), f"expected {expected!r} among {found}"


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    found = problems(tmp_path, """
        nodes:
          - name: a
            host: h
            gpus: lots
          - name: b
            host: g
            nics:
              - {name: eth0, speed: fast}
        """)
    assert len(found) == 2
    assert found[0].startswith("inventory.yaml:4:")
    assert found[1].startswith("inventory.yaml:8:")


def test_empty_file(tmp_path: Path) -> None:
    assert problems(tmp_path, "") == ("inventory.yaml:1:1: the inventory is empty: it needs at least a 'nodes:' list",)


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"nope\.yaml: no such inventory file"):
        load_inventory(tmp_path / "nope.yaml")


def test_shipped_inventories_load() -> None:
    root = Path(__file__).resolve().parent.parent / "inventories"
    files = sorted(root.glob("*.yaml"))
    assert len(files) >= 3
    for path in files:
        assert load_inventory(path).nodes


def test_run_section_is_read_and_a_bad_webhook_is_named_at_its_line() -> None:
    inv = parse_inventory_text("run: {hang_timeout: 600, notify: ['https://hooks.example/x']}\n"
                               "nodes: [{name: a, host: 10.0.0.1}]\n", "inv.yaml")
    assert inv.run.hang_timeout == 600 and inv.run.notify == ["https://hooks.example/x"]
    with pytest.raises(InventoryError) as info:
        parse_inventory_text("run:\n  notify: [hooks.example/x]\nnodes: [{name: a, host: 10.0.0.1}]\n", "inv.yaml")
    assert str(info.value).startswith("inv.yaml:2:")
