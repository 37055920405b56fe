"""``nvidia-smi topo -m``: real matrices from both driver layouts, and truncated ones rejected."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import topo
from clusterrun.facts.parsers.topo import Link, LinkKind

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "topo"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "gpus", "nics", "gpu0_gpu1", "gpu0_cpus", "gpu0_numa"),
    [
        ("2gpu_nv2.txt", 2, 0, "NV2", range(0, 24), set()),
        ("2gpu_phb_with_legend.txt", 2, 0, "PHB", range(0, 12), set()),
        ("4gpu_nv4_mlx5_rows.txt", 4, 4, "NV4", range(0, 36), {0}),
        ("4gpu_pcie_nic_legend.txt", 4, 4, "NODE", [*range(0, 20), *range(40, 60)], {0}),
        ("8gpu_a100_nv12.txt", 8, 0, "NV12", range(0, 24), {0}),
        ("8gpu_h100_nv18.txt", 8, 0, "NV18", range(0, 52), {0}),
    ],
)
def test_real_matrices_parse(name: str, gpus: int, nics: int, gpu0_gpu1: str, gpu0_cpus, gpu0_numa: set) -> None:
    t = topo.parse(fixture(name))

    assert (len(t.gpus), len(t.nics)) == (gpus, nics)
    assert str(t.link("GPU0", "GPU1")) == gpu0_gpu1
    assert str(t.link("GPU1", "GPU1")) == "X"
    assert t.gpus[0].cpus == frozenset(gpu0_cpus)
    assert t.gpus[0].numa_nodes == frozenset(gpu0_numa)


def test_nvlink_count_and_second_socket_affinity_h100() -> None:
    t = topo.parse(fixture("8gpu_h100_nv18.txt"))

    assert t.link("GPU3", "GPU7") == Link(LinkKind.NVLINK, 18)
    assert t.device("GPU4").cpus == frozenset(range(52, 104))
    assert t.device("GPU4").numa_nodes == frozenset({1})
    assert [g.gpu_index for g in t.gpus] == list(range(8))


def test_old_layout_names_nics_in_the_matrix() -> None:
    t = topo.parse(fixture("4gpu_nv4_mlx5_rows.txt"))

    assert [n.hca for n in t.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert [n.name for n in t.nearest_nics("GPU0")] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert str(t.link("GPU0", "mlx5_0")) == "NODE"
    # GPU2 sits on the other socket: every NIC is across the CPU interconnect.
    assert {str(t.link("GPU2", n.name)) for n in t.nearest_nics("GPU2")} == {"SYS"}
    assert str(t.link("mlx5_2", "mlx5_3")) == "PIX"
    assert t.device("mlx5_0").cpus == frozenset()  # NIC rows carry no affinity cells
    assert t.device("GPU2").numa_nodes == frozenset({1})


def test_new_layout_resolves_nic_legend_and_gpu_numa_id() -> None:
    t = topo.parse(fixture("4gpu_pcie_nic_legend.txt"))

    assert t.device("NIC0").hca == "mlx5_0"
    assert t.device("mlx5_0").name == "NIC0"
    assert t.device("NIC1").hca is None  # the legend excerpt ends after NIC0
    assert [n.name for n in t.nearest_nics("GPU0")] == ["NIC0", "NIC1"]
    assert [n.name for n in t.nearest_nics("GPU3")] == ["NIC2", "NIC3"]
    assert str(t.link("GPU0", "GPU2")) == "SYS"
    assert str(t.link("NIC0", "NIC1")) == "PIX"
    assert t.device("GPU2").cpus == frozenset([*range(20, 40), *range(60, 80)])
    assert t.device("GPU2").gpu_numa_id is None


@pytest.mark.parametrize(
    ("name", "lineno", "row"),
    [("8gpu_nv8_9nics_truncated.txt", 9, "GPU7"), ("8gpu_pcie_sys_10nics_truncated.txt", 8, "GPU6")],
)
def test_truncated_matrix_is_rejected_naming_the_short_row(name: str, lineno: int, row: str) -> None:
    with pytest.raises(ParseError) as err:
        topo.parse(fixture(name))

    assert err.value.lineno == lineno
    assert err.value.line is not None and err.value.line.startswith(row)
    assert "truncated" in str(err.value)


def test_matrix_missing_its_last_rows_is_rejected() -> None:
    header_and_first_row = "\n".join(fixture("8gpu_a100_nv12.txt").splitlines()[:3]) + "\n"

    with pytest.raises(ParseError, match="no row for GPU2"):
        topo.parse(header_and_first_row)


def test_p2p_matrix_is_not_topo_m() -> None:
    with pytest.raises(ParseError, match="unknown link type 'OK'") as err:
        topo.parse(fixture("p2p_r_8gpu_not_topo_m.txt"))

    assert err.value.lineno == 2


def test_two_matrices_in_one_text_are_rejected_after_the_first() -> None:
    text = fixture("2gpu_nv2.txt") + "\n" + fixture("2gpu_phb_with_legend.txt")

    with pytest.raises(ParseError, match="after the matrix") as err:
        topo.parse(text)

    assert err.value.lineno == 5


@pytest.mark.parametrize("text", ["", "   \n", "hello world\n", "GPU0 GPU1\nGPU0 X\n"])
def test_garbage_and_empty_raise(text: str) -> None:
    with pytest.raises(ParseError):
        topo.parse(text)


def test_pre_2017_soc_means_sys() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-7\nGPU1\tSOC\t X \t8-15\n"

    t = topo.parse(text)

    assert t.link("GPU0", "GPU1").kind is LinkKind.SYS
    assert t.device("GPU1").cpus == frozenset(range(8, 16))


def test_link_kinds_are_ranked_closest_first() -> None:
    order = [LinkKind.SELF, LinkKind.NVLINK, LinkKind.PIX, LinkKind.PXB, LinkKind.PHB, LinkKind.NODE, LinkKind.SYS]

    assert [k.rank for k in order] == sorted(k.rank for k in order)
    assert len({k.rank for k in order}) == len(order)
