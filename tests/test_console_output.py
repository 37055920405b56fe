"""What the terminal shows of rank output, and that the rank log gets everything whatever is shown."""

from __future__ import annotations

import io
from pathlib import Path

from clusterrun.launch.console import BAR_EVERY_PIPE, DISPLAY_MAX, Console
from clusterrun.launch.relay import LogRelay
from clusterrun.remote.answers import LogSize
from clusterrun.runs import RunDir


def _console(**kw: object) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(out, io.StringIO(), color=False, **kw), out  # type: ignore[arg-type]


def test_whole_lines_are_prefixed_one_per_line() -> None:
    console, out = _console()
    console.rank_output("n0", 3, "stdout", b"a\nb\n")
    console.rank_output("n0", 3, "stdout", b"\xff\xfe broken utf-8\n")
    assert out.getvalue() == "[n0:3] a\n[n0:3] b\n[n0:3] \ufffd\ufffd broken utf-8\n"


def test_progress_bar_updates_are_rate_limited_and_the_last_state_is_shown() -> None:
    console, out = _console()
    assert console.bar_every == BAR_EVERY_PIPE  # not a terminal
    console.rank_output("n0", 0, "stderr", b"\r  0%|bar|\r 10%|bar|\r", now=100.0)
    console.rank_output("n0", 0, "stderr", b" 20%|bar|\r", now=101.0)
    console.rank_output("n0", 0, "stderr", b" 30%|bar|\r", now=100.0 + BAR_EVERY_PIPE)
    console.rank_output("n0", 0, "stderr", b" 40%|bar|\r", now=100.5 + BAR_EVERY_PIPE)
    console.tick(now=100.6 + BAR_EVERY_PIPE)  # 40% is held: too soon after 30%
    assert out.getvalue() == "[n0:0]   0%|bar|\n[n0:0]  30%|bar|\n"
    console.tick(now=100.0 + 2 * BAR_EVERY_PIPE)
    assert out.getvalue().endswith("[n0:0]  40%|bar|\n")
    console.rank_output("n0", 0, "stderr", b" 50%|bar|\r100%|bar| done\n", now=100.1 + 2 * BAR_EVERY_PIPE)
    console.tick(final=True)
    assert out.getvalue().endswith("[n0:0]  40%|bar|\n[n0:0] 100%|bar| done\n")  # 50% superseded by the end


def test_crlf_ends_a_line_not_a_bar() -> None:
    console, out = _console()
    console.rank_output("n0", 0, "stdout", b"one\r\ntwo\r\n")
    assert out.getvalue() == "[n0:0] one\n[n0:0] two\n"


def test_a_long_line_in_pieces_is_shown_once_shortened_with_a_mark() -> None:
    console, out = _console()
    console.rank_output("n1", 2, "stdout", b"y" * (DISPLAY_MAX * 2), more=True)
    assert out.getvalue() == ""
    console.rank_output("n1", 2, "stderr", b"hello\n")  # the other stream's lines are not held up on screen
    console.rank_output("n1", 2, "stdout", b"z" * 100 + b"END\nnext\n")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[0] == "[n1:2] hello" and lines[2] == "[n1:2] next"
    assert lines[1].startswith("[n1:2] yyyy") and "more characters" in lines[1] and len(lines[1]) < DISPLAY_MAX + 200


def test_filters_hide_output_but_the_rank_log_has_it(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "r1")
    console, out = _console(ranks=[1])
    relay = LogRelay(run, console, {"n0": "~/.clusterrun/runs/r1/n0"})
    relay.write("n0", 0, "stdout", b"rank zero\n")
    relay.write("n0", 1, "stdout", b"rank one\n")
    quiet, quiet_out = _console(quiet=True)
    relay.console = quiet
    relay.write("n0", 1, "stderr", b"warn\n")
    relay.close()
    assert out.getvalue() == "[n0:1] rank one\n" and quiet_out.getvalue() == ""
    assert run.rank_log("n0", 0).read_bytes() == b"rank zero\n"
    assert run.rank_log("n0", 1).read_bytes() == b"rank one\nwarn\n"


def test_gaps_name_the_rank_the_size_and_where_the_log_stays(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "r2")
    relay = LogRelay(run, None, {"gpu1": "~/.clusterrun/runs/r2/gpu1"})
    relay.write("gpu1", 8, "stdout", b"a\nb\n")
    relay.expect("gpu1", {"8/stdout": LogSize(10, lines=5), "8/stderr": LogSize(0, lines=0)})
    relay.expect("gpu2", {})
    [gap] = relay.gaps()
    assert gap.to_dict() == {"node": "gpu1", "rank": 8, "stream": "stdout", "expected_bytes": 10,
                             "received_bytes": 4, "missing_bytes": 6, "missing_lines": 3,
                             "where": "~/.clusterrun/runs/r2/gpu1/torchrun/"}
    assert gap.describe().startswith("gpu1 rank 8 stdout: 3 line(s), 6 byte(s) missing from runs/")
    assert relay.offsets("gpu1") == {"8/stdout": 4}
    assert relay.reported == {"gpu1", "gpu2"}
    relay.close()


HOSTILE = b"a\x1b]0;owned\x07b \x1b]52;c;ZWNobyBoaQ==\x07 \x1b[2J\x1b[H \x1b[31mred\x1b[0m\ttab \xc2\x9b end\n"


def test_control_sequences_are_shown_escaped_colours_kept_the_log_exact(tmp_path: Path) -> None:
    """A rank cannot retitle or clear the terminal, nor write the clipboard (OSC 52); colours and tabs pass."""
    console, out = _console()
    relay = LogRelay(RunDir.create(tmp_path, "r1"), console, {})
    relay.write("n0", 0, "stdout", HOSTILE)
    relay.close()
    assert out.getvalue() == ("[n0:0] a\\x1b]0;owned\\x07b \\x1b]52;c;ZWNobyBoaQ==\\x07 \\x1b[2J\\x1b[H "
                              "\x1b[31mred\x1b[0m\ttab \\x9b end\n")
    assert (tmp_path / "r1" / "n0" / "rank0.log").read_bytes() == HOSTILE


def test_raw_shows_them_as_they_came() -> None:
    console, out = _console(raw=True)
    console.rank_output("n0", 0, "stdout", HOSTILE)
    assert out.getvalue() == "[n0:0] " + HOSTILE.decode()
