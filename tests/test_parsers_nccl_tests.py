"""nccl-tests ``*_perf`` tables: every header version, noise inside the table, cut tables and crashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import nccl_tests
from clusterrun.facts.parsers.nccl_tests import Measurement, PerfRow

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "nccl_tests"
NEW_COLUMNS = ("size", "count", "type", "redop", "root") + ("time", "algbw", "busbw", "wrong") * 2
OLD_COLUMNS = ("size", "count", "type", "redop") + ("time", "algbw", "busbw", "error") * 2


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "collective", "ranks", "rows", "avg", "peak", "last_size"),
    [
        ("alltoall_na_inplace_wrong_mpi_chatter.txt", "alltoall_perf", 16, 24, 9.04853, 38.01, 8589934592),
        ("mpirun_tag_output_p5_2node.txt", None, 0, 32, 52.9753, 437.89, 2147483648),
        ("nccl_info_interleaved_efa_2node.txt", None, 0, 28, 4.26966, 12.39, 1073741824),
        ("alltoall_single_rank_busbw_zero_implausible_algbw.txt", None, 1, 1, 0.0, 0.0, 33554432),
    ],
)
def test_complete_tables_give_every_row_and_the_average(
    name: str, collective: str | None, ranks: int, rows: int, avg: float, peak: float, last_size: int
) -> None:
    report = nccl_tests.parse(fixture(name))

    assert report.complete
    assert (report.collective, len(report.ranks), len(report.rows)) == (collective, ranks, rows)
    assert report.columns == NEW_COLUMNS
    assert report.avg_busbw_gbs == pytest.approx(avg)
    assert report.peak_busbw_gbs == pytest.approx(peak)
    assert report.largest is not None and report.largest.size_bytes == last_size
    assert (report.out_of_bounds, report.failures, report.cut_line, report.wrong_rows) == (0, (), None, ())


def test_new_header_row_reads_both_sides_and_banner() -> None:
    report = nccl_tests.parse(fixture("new_header_2node_cut_row.txt"))

    assert (report.version, report.collective) == ("2.20.0", "all_reduce_perf")
    assert [(r.rank, r.host, r.gpu) for r in report.ranks] == [(0, "spark-d708", "NVIDIA GB10"),
                                                               (1, "spark-dbf4", "NVIDIA GB10")]
    assert report.rows[0] == PerfRow(8192, 2048, "float", "sum", -1, Measurement(35.15, 0.23, 0.23, 0, None),
                                     Measurement(30.33, 0.27, 0.27, 0, None))


@pytest.mark.parametrize(
    ("name", "rows", "cut"),
    [
        ("new_header_2node_cut_row.txt", 4, "131072"),
        ("old_error_column_sharp_cut_row.txt", 6, "262144         65536"),
        ("single_5090_implausible_inplace_cut.txt", 4, "128            32     float     sum      -1     4.61    0.03    "
                                                       "0.00      0     0.15    0.86"),
    ],
)
def test_table_cut_off_keeps_the_rows_before_the_cut(name: str, rows: int, cut: str) -> None:
    report = nccl_tests.parse(fixture(name))

    assert (len(report.rows), report.cut_line, report.complete, report.avg_busbw_gbs) == (rows, cut, False, None)


def test_old_error_column_is_a_maximum_error_not_a_wrong_count() -> None:
    report = nccl_tests.parse(fixture("old_error_column_sharp_cut_row.txt"))

    assert report.columns == OLD_COLUMNS
    assert report.rows[-1] == PerfRow(131072, 32768, "float", "sum", None, Measurement(120.9, 1.08, 2.15, None, 1e-06),
                                      Measurement(117.4, 1.12, 2.22, None, 1e-06))
    assert report.peak_busbw_gbs == 2.22


def test_in_place_wrong_count_na_is_none() -> None:
    report = nccl_tests.parse(fixture("alltoall_na_inplace_wrong_mpi_chatter.txt"))

    assert all(r.in_place is not None and r.in_place.wrong is None for r in report.rows)
    assert all(r.out_of_place.wrong == 0 for r in report.rows)
    assert report.nccl_version == "2.30.3+cuda13.0"


@pytest.mark.parametrize(
    ("name", "rows", "first_failure"),
    [
        ("crash_after_17g_row_unhandled_cuda_error.txt", 0,
         "HCA-128: Test NCCL failure common.cu:1204 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '"),
        ("failure_first_then_cut_table_4090.txt", 3, "c2211f46f318: Test NCCL failure common.cu:1005 'unhandled CUDA error'"),
        ("oldest_header_nccl1_failure_before_rows.txt", 0, "NCCL failure all_reduce.cu:95 'unhandled cuda error'"),
    ],
)
def test_crash_is_a_finding_with_its_lines_not_an_exception(name: str, rows: int, first_failure: str) -> None:
    report = nccl_tests.parse(fixture(name))

    assert not report.complete
    assert len(report.rows) == rows
    assert report.failures[0] == first_failure


def test_crash_keeps_the_rank_and_pid_lines_that_follow_the_failure() -> None:
    report = nccl_tests.parse(fixture("crash_after_17g_row_unhandled_cuda_error.txt"))

    assert len(report.failures) == 8
    assert report.failures[1] == ".. HCA-128 pid 757466: Test failure common.cu:915"


def test_oldest_header_names_map_to_the_same_columns() -> None:
    report = nccl_tests.parse(fixture("oldest_header_nccl1_failure_before_rows.txt"))

    assert report.columns == OLD_COLUMNS
    assert [r.rank for r in report.ranks] == list(range(8))


def test_two_processes_printing_rank_0_are_reported() -> None:
    report = nccl_tests.parse(fixture("old_header_two_rank0_no_mpi.txt"))

    assert report.repeated_ranks == (0,)
    assert {r.host for r in report.ranks} == {"ip-172-31-20-228", "ip-172-31-22-230"}
    assert (report.rows, report.complete) == ((), False)


def test_healthy_multi_rank_run_repeats_no_rank() -> None:
    assert nccl_tests.parse(fixture("alltoall_na_inplace_wrong_mpi_chatter.txt")).repeated_ranks == ()


def test_output_of_another_tool_raises_naming_the_tool() -> None:
    text = (Path(__file__).parent / "fixtures" / "real" / "ib_write_bw" / "roce_92gbps_rdma_cm_cpu_freq_warning.txt").read_text()

    with pytest.raises(ParseError, match="unrecognised output from nccl-tests: no results table"):
        nccl_tests.parse(text)


def test_row_cut_inside_the_table_raises_with_its_line_number() -> None:
    # A real table with its 4096-byte row cut short: not at the end of the text, so not a cut-off output.
    lines = fixture("mpirun_tag_output_p5_2node.txt").splitlines()
    lines[15] = lines[15][:60]

    with pytest.raises(ParseError, match=r"nccl-tests: a row with 4 fields under a header of 13 \(line 16"):
        nccl_tests.parse("\n".join(lines))


def test_unknown_line_inside_the_table_raises() -> None:
    lines = fixture("new_header_2node_cut_row.txt").splitlines()
    lines.insert(13, "a stray sentence")

    with pytest.raises(ParseError, match=r"unexpected line inside the results table \(line 14: 'a stray sentence'\)"):
        nccl_tests.parse("\n".join(lines))


def test_unknown_header_raises() -> None:
    with pytest.raises(ParseError, match="an unknown results header"):
        nccl_tests.parse("#  size  count  type  time  algbw  busbw  speed\n")


def test_empty_output_raises() -> None:
    with pytest.raises(ParseError, match="empty output"):
        nccl_tests.parse("\n  \n")
