"""perftest ``ib_write_bw`` reports: numbers, units, warnings inside tables, errors with hints."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import ib_write_bw
from clusterrun.facts.parsers.ib_write_bw import BwRow, BwUnit

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "ib_write_bw"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "unit", "rows", "last", "average_gbps", "device", "gid_index", "warnings"),
    [
        (
            "roce_92gbps_rdma_cm_cpu_freq_warning.txt", BwUnit.GBIT, 1,
            BwRow(65536, 5000, 92.42, 92.40, 0.176230), 92.40, "mlx5_0", 3, 1,
        ),
        (
            "roce_mbytes_cpu_freq_warning_in_table.txt", BwUnit.MBYTE, 1,
            BwRow(65536, 5000, 11025.44, 11024.71, 0.176395), 92.482, "mlx5_0", 3, 1,
        ),
        (
            "cuda_dmabuf_sweep_with_cuda_chatter.txt", BwUnit.GBIT, 23,
            BwRow(8388608, 5000, 140.55, 140.40, 0.002092), 140.40, "mlx5_3", 3, 0,
        ),
    ],
)
def test_complete_reports(
    name: str, unit: BwUnit, rows: int, last: BwRow, average_gbps: float, device: str, gid_index: int, warnings: int
) -> None:
    report = ib_write_bw.parse(fixture(name))

    assert (report.unit, len(report.rows), report.rows[-1]) == (unit, rows, last)
    assert report.average_gbps == pytest.approx(average_gbps, abs=0.001)
    assert (report.device, report.link_type, report.gid_index, report.test) == (device, "Ethernet", gid_index, "RDMA_Write BW Test")
    assert report.complete
    assert len(report.warnings) == warnings
    assert (report.errors, report.hint) == ((), None)


def test_warning_inside_the_table_is_not_a_row() -> None:
    report = ib_write_bw.parse(fixture("roce_mbytes_cpu_freq_warning_in_table.txt"))

    assert report.warnings == (
        "Conflicting CPU frequency values detected: 1000.259000 != 2105.420000. CPU Frequency is not max.",
    )
    assert report.mtu == 1024


def test_both_row_widths_of_a_sweep() -> None:
    rows = ib_write_bw.parse(fixture("cuda_dmabuf_sweep_with_cuda_chatter.txt")).rows

    assert rows[0] == BwRow(2, 5000, 0.057240, 0.056633, 3.539560)  # REPORT_FMT_EXT, below 0.1 Gb/s
    assert rows[1] == BwRow(4, 5000, 0.12, 0.11, 3.582327)
    assert [r.bytes for r in rows] == [2**k for k in range(1, 24)]


def test_completion_error_after_partial_sweep() -> None:
    report = ib_write_bw.parse(fixture("roce_sweep_then_completion_error.txt"))

    assert len(report.rows) == 16
    assert report.rows[-1] == BwRow(65536, 5000, 381.50, 381.41, 0.727473)
    assert not report.complete
    assert report.errors == (
        "Completion with error at client",
        "Failed status 10: wr_id 0 syndrom 0x88",
        "scnt=128, ccnt=0",
        "Failed to complete run_iter_bw function successfully",
    )
    assert report.hint is not None and "GID index" in report.hint


def test_retry_exceeded_has_its_own_hint() -> None:
    # As ib_write_bw prints it when the RDMA path breaks (perftest's NOTIFY_COMP_ERROR_SEND).
    text = fixture("roce_92gbps_rdma_cm_cpu_freq_warning.txt").split(" #bytes")[0]
    text += " Completion with error at client\n Failed status 12: wr_id 0 syndrom 0x81\nscnt=128, ccnt=0\n"

    report = ib_write_bw.parse(text)

    assert report.hint is not None and "retry counter exceeded" in report.hint
    assert report.rows == ()


def test_no_server_listening() -> None:
    report = ib_write_bw.parse(fixture("error_couldnt_connect.txt"))

    assert report.errors == (
        "Couldn't connect to 192.168.125.211:18515",
        "Unable to open file descriptor for socket connection Unable to init the socket connection",
    )
    assert report.hint is not None and "start the ib_write_bw server first" in report.hint
    assert (report.rows, report.test, report.average_gbps) == ((), None, None)


@pytest.mark.parametrize("name", ["report_min_bw_header_only.txt", "bidir_header_truncated.txt"])
def test_report_cut_before_the_table_is_incomplete(name: str) -> None:
    report = ib_write_bw.parse(fixture(name))

    assert (report.rows, report.complete, report.unit) == ((), False, None)
    assert report.test is not None


def test_bidirectional_header_and_peak_warning() -> None:
    report = ib_write_bw.parse(fixture("bidir_header_truncated.txt"))

    assert report.test == "RDMA_Write Bidirectional BW Test"
    assert (report.device, report.qps) == ("mlx5_3", 2)
    assert report.warnings == ("WARNING: BW peak won't be measured in this run.",)


@pytest.mark.parametrize(
    ("name", "lineno", "line"),
    [("client_ib_sweep_gbits_truncated.txt", 24, " 32         5000"), ("server_roce_gid3_truncated.txt", 26, " 65536      664644")],
)
def test_cut_off_row_is_rejected(name: str, lineno: int, line: str) -> None:
    with pytest.raises(ParseError, match="truncated row") as err:
        ib_write_bw.parse(fixture(name))

    assert (err.value.lineno, err.value.line) == (lineno, line)


def test_latency_report_is_rejected() -> None:
    with pytest.raises(ParseError, match="latency") as err:
        ib_write_bw.parse(fixture("ib_write_lat_not_bw.txt"))

    assert err.value.lineno == 2


@pytest.mark.parametrize("text", ["", "hello\n", "PING 127.0.0.1 (127.0.0.1) 56(84) bytes of data.\n"])
def test_not_perftest_output_raises(text: str) -> None:
    with pytest.raises(ParseError) as err:
        ib_write_bw.parse(text)

    assert err.value.tool == "ib_write_bw"


def test_mbytes_are_binary_megabytes() -> None:
    assert BwUnit.MBYTE.to_gbps(1000.0) == pytest.approx(8.388608)
    assert BwUnit.GBIT.to_gbps(92.4) == 92.4


@pytest.mark.parametrize(
    ("name", "test", "last", "average_gbps", "warnings"),
    [
        ("server_mib_cuda_gdr_rtx4080.txt", "RDMA_Write BW Test", BwRow(65536, 5000, 14954.91, 14948.67, 0.239179),
         125.399, 0),
        ("send_bw_mib_ndr_cpu_freq_warning_in_table.txt", "Send BW Test",
         BwRow(65536, 1000, 46567.34, 46557.03, 0.744912), 390.549, 1),
    ],
)
def test_newer_perftest_mebibyte_tables_convert_to_gbits(
    name: str, test: str, last: BwRow, average_gbps: float, warnings: int
) -> None:
    report = ib_write_bw.parse(fixture(name))

    assert (report.unit, report.test, report.link_type, report.device) == (BwUnit.MIBYTE, test, "IB", "mlx5_0")
    assert report.rows == (last,)
    assert report.average_gbps == pytest.approx(average_gbps, abs=0.001)  # 2**20 bytes/s, as perftest's MB/sec
    assert report.complete and len(report.warnings) == warnings
    assert (report.errors, report.hint) == ((), None)
