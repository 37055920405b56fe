"""nvidia-smi CSV queries and banner: recorded real outputs parse to the values printed in them."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import nvidia_smi
from clusterrun.facts.parsers.nvidia_smi import ComputeApps, GpuQuery

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "nvidia_smi"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "query_gpu_index_uuid_memory_h200_busy.csv",
            [
                (0, "GPU-78aaaccb-3af1-11b3-b1f8-3828c251d9f2", "NVIDIA H200-141C", 144384, 45662),
                (1, "GPU-7bdd753d-3af1-11b3-a839-80f10ebdf224", "NVIDIA H200-141C", 144384, 131470),
                (2, "GPU-7eb48ff1-3af1-11b3-9b3a-93ee06a0ff76", "NVIDIA H200-141C", 144384, 137255),
                (3, "GPU-8187d0e1-3af1-11b3-a3da-3990b94501cf", "NVIDIA H200-141C", 144384, 111082),
            ],
        ),
        ("query_gpu_driver_memory_gtx1050ti.csv", [(0, None, "NVIDIA GeForce GTX 1050 Ti", 4096, 6)]),
        (
            "query_gpu_padded_columns_two_models.csv",
            [
                (0, None, "NVIDIA GeForce RTX 5070 Laptop GPU", 8151, None),
                (1, None, "NVIDIA GeForce RTX 5060 Ti", 16311, None),
            ],
        ),
        ("query_gpu_util_driver_pstate_rtx5060ti.csv", [(None, None, "NVIDIA GeForce RTX 5060 Ti", 16311, 1)]),
    ],
)
def test_query_gpu_with_header_and_units_gives_typed_gpus(name: str, expected: list[tuple]) -> None:
    result = nvidia_smi.parse(fixture(name))

    assert [(g.index, g.uuid, g.name, g.memory_total_mib, g.memory_used_mib) for g in result.gpus] == expected
    assert result.error is None


def test_busy_gpus_show_their_used_memory() -> None:
    gpus = nvidia_smi.parse(fixture("query_gpu_index_uuid_memory_h200_busy.csv")).gpus

    busy = [g.index for g in gpus if g.memory_used_mib and g.memory_total_mib and g.memory_used_mib / g.memory_total_mib > 0.5]

    assert busy == [1, 2, 3]


def test_utilization_driver_and_extra_fields_are_read() -> None:
    (gpu,) = nvidia_smi.parse(fixture("query_gpu_util_driver_pstate_rtx5060ti.csv")).gpus

    assert (gpu.utilization_gpu_pct, gpu.driver_version) == (0, "580.178.04")
    assert gpu.value("pstate") == "P8"
    assert gpu.value("compute_cap") == "12.0"


def test_padded_columns_and_bus_ids() -> None:
    gpus = nvidia_smi.parse(fixture("query_gpu_padded_columns_two_models.csv")).gpus

    assert [g.pci_bus_id for g in gpus] == ["00000000:02:00.0", "00000000:06:00.0"]
    assert {g.driver_version for g in gpus} == {"616.92"}


def test_header_uses_canonical_names_for_requested_aliases() -> None:
    # Requested gpu_name,gpu_bus_id; nvidia-smi printed "name, pci.bus_id".
    gpus = nvidia_smi.parse(fixture("query_gpu_name_busid_vbios_h100.csv")).gpus

    assert [(g.name, g.pci_bus_id) for g in gpus] == [
        ("NVIDIA H100 80GB HBM3", "00000000:04:00.0"),
        ("NVIDIA H100 80GB HBM3", "00000000:8B:00.0"),
    ]
    assert gpus[0].value("gpu_name") == "NVIDIA H100 80GB HBM3"
    assert gpus[0].value("vbios_version") == "96.00.89.00.01"


def test_compute_apps_header_alias_process_name() -> None:
    apps = nvidia_smi.parse_compute_apps(fixture("query_compute_apps_gpu_uuid_name_header.csv"))

    assert [(p.gpu_uuid, p.process_name) for p in apps.processes] == [
        ("GPU-d0180485-9584-433c-6782-c335d5df2cb3", "vgpu"),
        ("GPU-777ead31-954e-837f-590f-6c4974d8e571", "vgpu"),
        ("GPU-777ead31-954e-837f-590f-6c4974d8e571", "vgpu"),
    ]


def test_compute_apps_with_units_and_noheader_nounits_agree() -> None:
    fields = ("timestamp", "gpu_name", "pid", "process_name", "used_memory")
    with_units = nvidia_smi.parse_compute_apps(fixture("query_compute_apps_with_units.csv"))
    bare = nvidia_smi.parse_compute_apps(fixture("query_compute_apps_noheader_nounits.csv"), fields)

    for apps in (with_units, bare):
        (proc,) = apps.processes
        assert (proc.pid, proc.process_name, proc.used_memory_mib) == (1106871, "/app/llama-server", 23342)
        assert proc.value("gpu_name") == "NVIDIA GeForce RTX 3090"


@pytest.mark.parametrize("text", [fixture("query_compute_apps_header_only_no_processes.csv"), "", "\n"])
def test_no_compute_processes_is_empty_not_an_error(text: str) -> None:
    assert nvidia_smi.parse_compute_apps(text) == ComputeApps(processes=())


def test_banner_gives_driver_and_cuda_versions() -> None:
    banner = nvidia_smi.parse_banner(fixture("banner_a40x10_no_processes.txt"))

    assert (banner.smi_version, banner.driver_version, banner.cuda_version) == ("550.127.05", "550.127.05", "12.4")


def test_default_query_noheader_nounits_maps_not_available_to_none() -> None:
    # The shape of GPU_QUERY's output; [N/A]/[Not Supported] as nvidia-smi prints them.
    text = "0, GPU-aaaa, Tesla K80, 00000000:04:00.0, 470.182.03, 11441, 512, [Not Supported]\n"

    (gpu,) = nvidia_smi.parse(text).gpus

    assert (gpu.index, gpu.uuid, gpu.memory_used_mib, gpu.utilization_gpu_pct) == (0, "GPU-aaaa", 512, None)
    assert nvidia_smi.GPU_QUERY[1] == "--query-gpu=" + ",".join(nvidia_smi.GPU_FIELDS)


@pytest.mark.parametrize(
    "message",
    [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
        "NVIDIA driver is installed and running.",
        "No devices were found",
        "Failed to initialize NVML: Driver/library version mismatch",
    ],
)
def test_nvidia_smi_own_failures_are_findings(message: str) -> None:
    assert nvidia_smi.parse(message + "\n") == GpuQuery(gpus=(), error=message)


def test_warning_lines_are_kept_apart_from_rows() -> None:
    text = "WARNING: infoROM is corrupted at gpu 0000:04:00.0\n" + fixture("query_gpu_driver_memory_gtx1050ti.csv")

    result = nvidia_smi.parse(text)

    assert result.warnings == ("WARNING: infoROM is corrupted at gpu 0000:04:00.0",)
    assert [g.name for g in result.gpus] == ["NVIDIA GeForce GTX 1050 Ti"]


def test_process_name_containing_commas_is_kept_whole() -> None:
    text = "GPU-aaaa, 4242, python train.py --lr=1e-4,warmup, 1000\n"

    (proc,) = nvidia_smi.parse_compute_apps(text).processes

    assert (proc.pid, proc.process_name, proc.used_memory_mib) == (4242, "python train.py --lr=1e-4, warmup", 1000)


def test_truncated_row_is_named() -> None:
    text = fixture("query_gpu_index_uuid_memory_h200_busy.csv").splitlines()
    text[2] = text[2][:60]  # output cut mid-row

    with pytest.raises(ParseError) as err:
        nvidia_smi.parse("\n".join(text))

    assert err.value.lineno == 3
    assert err.value.line == text[2]
    assert "expected 5 columns" in str(err.value)


@pytest.mark.parametrize(
    ("text", "lineno"),
    [
        ("", None),
        ("        GPU0    GPU1    CPU Affinity    NUMA Affinity\nGPU0     X      NV2     0-23            N/A\n", 1),
        ("0, GPU-aaaa, H100, 00000000:04:00.0, 550.54.15, lots, 1, 0\n", 1),
    ],
)
def test_not_nvidia_smi_csv_raises(text: str, lineno: int | None) -> None:
    with pytest.raises(ParseError) as err:
        nvidia_smi.parse(text)

    assert err.value.tool == "nvidia-smi"
    assert err.value.lineno == lineno


def test_banner_missing_raises_with_first_line() -> None:
    with pytest.raises(ParseError) as err:
        nvidia_smi.parse_banner(fixture("query_gpu_driver_memory_gtx1050ti.csv"))

    assert err.value.lineno == 1
