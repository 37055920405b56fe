"""Hostile or broken input never crashes, hangs or floods: inventory YAML, hostfiles and the host, GPU and env flags.

Hypothesis mutates the repository's own inventories, the documented inventory and hostfile examples and
hand-written flag values: random bytes and characters, control characters, numbers of thousands of digits,
aliases, anchors, deep nesting, tags. Whatever comes in, the real loaders either succeed or raise one of
clusterrun's errors whose message names the file (with line and column where the problem has one) or the
flag, on lines without control characters and of bounded length, within a few seconds. ``derandomize``
makes every run (CI included) try the same examples.
"""

from __future__ import annotations

import os
import re
import stat
import string
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from loadscale import scaled

from clusterrun.cli.main import main
from clusterrun.errors import InventoryError, UsageError
from clusterrun.inventory.sources import HostSource, load_cluster
from clusterrun.inventory.textfile import MAX_FILE_BYTES
from clusterrun.inventory.yaml_source import MAX_DEPTH, load_inventory, parse_inventory_text
from clusterrun.planning.network import resolve_data_network

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "examples" / "train_ddp.py")
_FENCE_RE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)

#: Generous: every example is a few kilobytes and loads in milliseconds (scaled with the machine's load).
SECONDS_PER_EXAMPLE = 5.0
#: No line of a message may be longer, whatever the input: values are quoted cut short.
MAX_LINE = 1000

# No shrinking: a failing example of kilobytes takes minutes to shrink, and CI should fail fast; rerun the test
# with phases including Phase.shrink to get the smallest example.
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False, report_multiple_bugs=False,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _fenced(path: Path, language: str, marker: str) -> list[str]:
    return [body for lang, body in _FENCE_RE.findall(path.read_text(encoding="utf-8"))
            if lang == language and body.startswith(marker)]


INVENTORY_SEEDS = sorted(p.read_text(encoding="utf-8") for p in (ROOT / "inventories").glob("*.yaml")) + [
    body for doc in ("inventory.md", "network.md", "oneliners.md") for body in _fenced(ROOT / "docs" / doc, "yaml", "#")
]
HOSTFILE_SEEDS = [
    *_fenced(ROOT / "docs" / "oneliners.md", "text", "# hostfile"),
    "worker-1 slots=4\nworker-2 slots=4\n",
    "# comment\nfoo.example.com\nbar.example.com slots=2\nyow.example.com slots=4 max-slots=4\n",
    "10.0.0.1 slots=8\n10.0.0.2 max_slots=8 slots=8\nfe80::1\n",
]

# Values that have broken YAML loaders and validators: numbers too long for int(), sexagesimal numbers
# that take minutes to compute, dates that do not exist, infinities, escapes for control characters,
# aliases to nothing or to themselves, unsafe tags, deep nesting and merge keys.
HOSTILE_SCALARS = [
    "9" * 5000, "-1", "0", "65536", "1024", "1025", "99999999999999999999", "-" + "9" * 40, "1e999", "-.inf",
    ".inf", ".nan", "0x" + "f" * 300, "0b" + "1" * 2000, "0o777", "1" + ":59" * 3000, "190:20:30", "1_000",
    "2001-13-45", "2001-02-29", "2001-12-14t21:59:43.10-05:00", "9999-99-99 99:99:99",
    '"\\0"', '"a\\x00b"', '"\\e[2J\\e]0;pwned\\a"', '"line\\rover"', '"a\\nb"', '"\\t"', '"\\u2028"', '"\\x85"',
    '"\\x9b31m"', '"\\x7f"', '"\\uD800"', '"\\U0010FFFF"', "'" + "x" * 20000 + "'", "x" * 20000,
    "*undefined", "&a [*a]", "&b {<<: *b}", "!!binary AAAA", "!!binary '!!!'", "!!python/object:os.system {}",
    "!custom x", "!!set {a, b}", "!!omap [a: 1]", "!!timestamp nope", "!!bool maybe", "!!int x", "!!float x", "!!str 1",
    "[" * 200 + "]" * 200, "{a: " * 60 + "1" + "}" * 60, "[" * 5000, "~", "null", "yes", "off", "''", "{}",
    "[]", "[1, 1, 1]", "&c 1", "*c", "? [a]\n: b", "|\n  x\n  y", ">-\n  folded", "%YAML 1.1", "---", "...",
    "- x", "{<<: [*c]}", "a: b: c", "'unterminated", '"\\q"', "@", "`", "\t", "%", "10.0.0.1/33", "::1/129",
]
# Put before a document: an alias bomb ("billion laughs"), a self-referencing anchor, nesting past the bound.
PREAMBLES = [
    'lol0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
        f"lol{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10)),
    "self: &s [*s]\n",
    "x: &x {<<: *x}\n",
    "deep: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n",
    "chain0: &c0 [[[[[[[[1]]]]]]]]\n" + "".join(f"chain{i}: &c{i} [[[[*c{i - 1}]]]]\n" for i in range(1, 12)),
    "<<: &m {nodes: []}\n",
]
_NASTY_CHARS = "\x00\x01\x07\x08\x0b\x0c\x0e\x1b\x1f\x7f\x85\x9b\u2028\u2029\ufeff\ud800\ufffe" + "[]{}&*!|>'\"%@`#,:-?\n\t "
_VALUE_AT_RE = re.compile(r"(?:: |- |\[|, )")  # where a scalar starts in block or flow YAML


# --- the properties ---------------------------------------------------------------------------------------------


def assert_message_names(message: str, names: tuple[str, ...], *, lines: bool) -> None:
    """One problem per line, each naming one of ``names`` (a file or flags); with ``lines``, a file's problems
    carry ``:line`` (and column). No control characters, no line longer than :data:`MAX_LINE`."""
    assert message, "empty message"
    rows = message.split("\n")
    for row in rows:
        assert row.isprintable(), f"control character in message line {row!r}"
        assert len(row) <= MAX_LINE, f"message line of {len(row)} characters: {row[:200]!r}..."
        assert "Traceback" not in row
    name = "|".join(re.escape(n) for n in names)
    located = rf"(?:{name})(?::\d+(?::\d+)?)?[: ] ?\S" if not lines else rf"(?:{name}):\d+(?::\d+)?: \S"
    if len(rows) == 1:
        assert re.match(located, rows[0]), rows[0]
        return
    # Several problems: a header, then one indented line per problem (perhaps ending with a count of the rest).
    assert re.match(rf"(?:(?:{name}): )?\d+ problems:?$", rows[0]), rows[0]
    for row in rows[1:]:
        assert row.startswith("  "), row
        assert re.match(located, row[2:]) or re.fullmatch(r"\.\.\. and \d+ more; fix these first", row[2:]), row


def within_time(call: Callable[[], T]) -> T:
    start = time.perf_counter()
    try:
        return call()
    finally:
        elapsed = time.perf_counter() - start
        assert elapsed < scaled(SECONDS_PER_EXAMPLE), f"took {elapsed:.1f}s"


def _argv(text: str) -> str:
    """``text`` as a process could receive it: an argument cannot hold a NUL."""
    return text.replace("\x00", "")


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``clusterrun ARGV`` through the real entry point, its streams captured by click's CliRunner."""
    runner = CliRunner()
    with runner.isolation() as streams:
        code = main(list(argv))
    return code, streams[0].getvalue().decode(errors="backslashreplace"), \
        streams[1].getvalue().decode(errors="backslashreplace")


# --- strategies -------------------------------------------------------------------------------------------------


@st.composite
def mutated_inventory(draw: st.DrawFn) -> bytes:
    """A repository inventory after one to four mutations, as the bytes of a file."""
    text = draw(st.sampled_from(INVENTORY_SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["value", "value", "value", "insert", "delete", "line", "preamble", "indent"]))
        if kind == "value":
            starts = [m.end() for m in _VALUE_AT_RE.finditer(text)] or [len(text)]
            at = draw(st.sampled_from(starts))
            end = min((i for i in (text.find(c, at) for c in "\n,]}#") if i != -1), default=len(text))
            new = draw(st.sampled_from(HOSTILE_SCALARS) | st.text(_NASTY_CHARS + string.ascii_letters, max_size=12))
            text = text[:at] + new + text[end:]
        elif kind == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.text(_NASTY_CHARS, min_size=1, max_size=6) | st.sampled_from(HOSTILE_SCALARS)) \
                + text[at:]
        elif kind == "delete":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + text[at + draw(st.integers(1, 40)):]
        elif kind == "line":
            rows = text.split("\n")
            i, j = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, len(rows) - 1))
            rows.insert(j, rows[i])  # a duplicated line: duplicate keys, repeated nodes, broken indentation
            text = "\n".join(rows)
        elif kind == "preamble":
            text = draw(st.sampled_from(PREAMBLES)) + text
        else:
            text = "\n".join(" " * draw(st.integers(0, 3)) + row for row in text.split("\n"))
    data = text.encode("utf-8", errors="surrogatepass")
    if draw(st.integers(0, 9)) == 0:  # bytes that are not UTF-8
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=4)) + data[at:]
    return data


_HOST_CHARS = string.ascii_lowercase + string.digits + "-.:[],_ " + "\x00\x1b\n\r\t\u00e9\u0660\uff10"
_HOSTY = st.text(_HOST_CHARS, max_size=40)
_NUMBERS = st.sampled_from(["0", "1", "8", "1023", "1024", "65535", "65536", "4294967296", "9" * 30, "9" * 5000,
                            "-1", "007", "0" * 300 + "1", "0" * 5000 + "1", "1e3", "٣", "８"])


@st.composite
def hostlist_text(draw: st.DrawFn) -> str:
    """Slurm host lists: mostly well-formed in shape with hostile numbers (so that the numbers are reached),
    sometimes with hostile names, brackets and separators."""
    hostile = draw(st.integers(0, 3)) == 0
    prefixes = ["gpu", "n", "rack1-n", "a.b", "", "-x", "x" * 300, "h\x00", "é"] if hostile else ["gpu", "n", "a.b"]
    suffixes = ["", "-ib", "]", "[", ".local", "[1-2]"] if hostile else ["", "-ib", ".local"]
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        prefix = draw(st.sampled_from(prefixes))
        if draw(st.booleans()):
            ranges = ",".join(draw(_NUMBERS) + (f"-{draw(_NUMBERS)}" if draw(st.booleans()) else "")
                              for _ in range(draw(st.integers(1, 3))))
            parts.append(f"{prefix}[{ranges}]{draw(st.sampled_from(suffixes))}")
        else:
            parts.append(prefix + draw(_NUMBERS))
    if hostile and draw(st.booleans()):
        return draw(_HOSTY)
    return draw(st.sampled_from([",", " ", ",,", "\n"] if hostile else [",", " "])).join(parts)


@st.composite
def ips_text(draw: st.DrawFn) -> str:
    items = [draw(st.sampled_from(["10.0.0.1", "gpu-02", "[fe80::1]", "fe80::1", "256.1.1.1", "1.2.3", "[::1",
                                   "::1]", "a" * 300, "-oProxyCommand=x", "h\x00", "é.example", "[10.0.0.1]", ""]))
             + draw(st.sampled_from(["", ":22", ":", ":0", ":65536", ":" + "9" * 5000, ":x", ":2222:1"]))
             for _ in range(draw(st.integers(1, 4)))]
    return ",".join(items) if draw(st.booleans()) else draw(_HOSTY)


@st.composite
def gpus_text(draw: st.DrawFn) -> str:
    items = [draw(_NUMBERS) + (f"-{draw(_NUMBERS)}" if draw(st.booleans()) else "")
             for _ in range(draw(st.integers(1, 4)))]
    return ",".join(items) if draw(st.booleans()) else draw(st.text("0123456789-, x\x00", max_size=20))


@st.composite
def hostfile_bytes(draw: st.DrawFn) -> bytes:
    rows = draw(st.sampled_from(HOSTFILE_SEEDS)).split("\n")
    for _ in range(draw(st.integers(1, 4))):
        host = draw(st.sampled_from(["worker-9", "10.0.0.9", "fe80::9", "w\x00", "-x", "a" * 300, "", "é", "WORKER-1"]))
        setting = draw(st.sampled_from(["", " slots=4", " slots=" + "9" * 5000, " slots=0", " slots=-1", " slots=",
                                        " max_slots=1 slots=2", " slots=1 slots=1", " slots = 4", " gpus=8", " x",
                                        " slots=٣", " #c", " slots=4\x0c", " " + "k" * 20000 + "=1"]))
        rows.insert(draw(st.integers(0, len(rows))), host + setting + draw(st.text(_NASTY_CHARS, max_size=3)))
    data = "\n".join(rows).encode("utf-8", errors="surrogatepass")
    if draw(st.integers(0, 9)) == 0:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=4)) + data[at:]
    return data


_ENV_NAMES = st.sampled_from(["NCCL_DEBUG", "A", "_X", "1BAD", "A-B", "", "A B", "A\x00", "é", "X" * 300])
_ENV_VALUES = st.text(_NASTY_CHARS + string.ascii_letters + "=$`();", max_size=20) | st.sampled_from(
    ["", "=", "a=b=c", "x" * 5000, "\x00", "\x1b[2J", "multi\nline", "tab\there"])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# --- inventories ------------------------------------------------------------------------------------------------


@settings(FUZZ, max_examples=1000)
@given(data=mutated_inventory())
def test_mutated_inventory_loads_or_names_file_and_line(workdir: Path, data: bytes) -> None:
    path = workdir / "inventory.yaml"
    path.write_bytes(data)

    def load() -> None:
        inv = load_inventory(path)
        resolve_data_network(inv)  # what `check` does next

    try:
        within_time(load)
    except InventoryError as exc:
        assert_message_names(str(exc), (str(path),), lines=True)
        for problem in exc.problems:
            assert problem.startswith(f"{path}:"), problem


@settings(FUZZ, max_examples=300)
@given(text=st.text(_NASTY_CHARS + string.printable, max_size=300))
def test_garbage_text_is_invalid_yaml_at_a_line(text: str) -> None:
    try:
        within_time(lambda: parse_inventory_text(text, "garbage.yaml"))
    except InventoryError as exc:
        assert_message_names(str(exc), ("garbage.yaml",), lines=True)


@settings(FUZZ, max_examples=40)
@given(data=mutated_inventory())
def test_check_command_names_the_file_and_line_of_every_problem(workdir: Path, data: bytes) -> None:
    path = workdir / "cli.yaml"
    path.write_bytes(data)
    code, out, err = within_time(lambda: run_cli("check", str(path)))
    assert code in (0, 2)
    if code == 0:
        assert out.startswith(f"{path}: ok: ")
    else:
        assert_message_names(err.rstrip("\n"), (str(path),), lines=True)


def test_alias_bomb_fails_at_once_without_expanding() -> None:
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(InventoryError, match=r"bomb\.yaml:\d+:\d+: with its aliases expanded, this value holds "
                                                 r"more than \d+ values"):
            parse_inventory_text(PREAMBLES[0] + "nodes: [{name: a, host: h}]\n", "bomb.yaml")
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < scaled(2) and peak < 20 * 2**20


@pytest.mark.parametrize(("text", "expected"), ids=["recursive", "deep", "long int", "sexagesimal", "date", "raw nul"], argvalues=[
    ("a: &a [*a]\nnodes: []\n", r"x\.yaml:1:8: alias \*a is used inside the value it names"),
    ("nodes: " + "[" * 40 + "]" * 40, r"x\.yaml:1:\d+: values nest deeper than 32 levels"),
    ("nodes: [{name: a, host: h, gpus: " + "9" * 5000 + "}]", r"x\.yaml:1:34: a number of 5000 characters"),
    ("nodes: [{name: a, host: h, gpus: 1" + ":59" * 100000 + "}]", r"x\.yaml:1:34: a number of 300001 characters"),
    ("nodes: [{name: a, host: 2001-13-45}]", r"x\.yaml:1:25: invalid YAML: cannot read '2001-13-45': month must"),
    ("nodes: [{name: a\0, host: h}]", r"x\.yaml:1:17: invalid YAML: the control character '\\x00' is not allowed"),
])
def test_hostile_yaml_is_one_error_at_its_place(text: str, expected: str) -> None:
    with pytest.raises(InventoryError, match=expected):
        within_time(lambda: parse_inventory_text(text, "x.yaml"))


@pytest.mark.parametrize(("field", "value", "where"), [
    ("env: {A: VALUE}", '"x\\0y"', "nodes[0].env.A: the value holds the control character NUL"),
    ("env: {A: VALUE}", '"\\e[2J"', "nodes[0].env.A: the value holds the control character ESC"),
    ("env: {A: VALUE}", '"a\\rb"', "nodes[0].env.A: the value holds the control character carriage return"),
    ("python: VALUE", '"/usr/bin/python\\0"', "nodes[0].python: the text holds the control character NUL"),
    ("workdir: VALUE", '"/a\\nb"', "nodes[0].workdir: the text holds the control character newline"),
    ("ssh: {user: VALUE}", '"root\\x1b"', "nodes[0].ssh.user: the text holds the control character ESC"),
    ("ssh: {identity_file: VALUE}", '"~/.ssh/\\u2028id"', "nodes[0].ssh.identity_file: the text holds"),
    ("labels: [VALUE]", '"\\x9b"', "nodes[0].labels[0]: the text holds the control character U+009B"),
    ("nics: [{name: VALUE}]", '"eth\\x000"', "nodes[0].nics[0].name: expected a network interface name"),
    ("nics: [{name: eth0, kind: roce, hca: VALUE}]", '"mlx5\\x07"', "nodes[0].nics[0].hca: the text holds"),
    ("name: b\n    host: VALUE", '"h\\0"', "nodes[0].host: the host holds the control character NUL"),
])
def test_control_characters_are_refused_at_check_with_their_place(field: str, value: str, where: str) -> None:
    text = f"nodes:\n  - name: a\n    host: h\n    {field.replace('VALUE', value)}\n"
    if field.startswith("name: b"):
        text = f"nodes:\n  - {field.replace('VALUE', value)}\n"
    with pytest.raises(InventoryError) as info:
        parse_inventory_text(text, "inv.yaml")
    assert re.match(r"inv\.yaml:\d+:\d+: ", str(info.value)) and where in str(info.value), str(info.value)
    assert str(info.value).isprintable()


def test_env_values_may_hold_tabs_and_newlines() -> None:
    inv = parse_inventory_text('nodes: [{name: a, host: h, env: {PEM: "a\\n\\tb"}}]', "inv.yaml")
    assert inv.nodes[0].env["PEM"] == "a\n\tb"


@pytest.mark.parametrize(("field", "expected"), [
    ("ssh: {port: 65536}", "less than or equal to 65535"),
    ("gpus: [1024]", "less than or equal to 1023"),
    ("gpus: 1025", "a GPU count between 0 and 1024"),
    ("nproc_per_node: 1025", "less than or equal to 1024"),
    ("node_rank: 99999999999999999999", "less than or equal to 65535"),
    ("ssh: {connect_timeout: .inf}", "finite number"),
    ("nics: [{name: e, speed: 99999999999999999999}]", "is above 100tbit"),
    ("nics: [{name: e, speed: " + "9" * 400 + "gbit}]", "expected a rate like '100gbit'"),
])
def test_numbers_have_upper_bounds(field: str, expected: str) -> None:
    with pytest.raises(InventoryError, match=re.escape(expected)):
        parse_inventory_text(f"nodes:\n  - name: a\n    host: h\n    {field}\n", "inv.yaml")


def test_hang_timeout_is_bounded() -> None:
    with pytest.raises(InventoryError, match=r"run\.hang_timeout: input should be less than or equal to 604800"):
        parse_inventory_text("run: {hang_timeout: 1e9}\nnodes: [{name: a, host: h}]\n", "inv.yaml")


# --- files that are not inventories -----------------------------------------------------------------------------


def _special_files(tmp: Path) -> Iterator[tuple[Path, str]]:
    yield tmp, "is a directory"
    big = tmp / "big.yaml"
    with big.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    yield big, "more than the 4 MiB"
    latin1 = tmp / "latin1.yaml"
    latin1.write_bytes(b"nodes:\n  - name: caf\xe9\n")
    yield latin1, ":2:14: byte 0xe9 is not UTF-8 text"
    if os.path.exists("/dev/zero"):
        yield Path("/dev/zero"), "is a character device, not a regular file"
    yield tmp / "missing.yaml", "no such"


@pytest.mark.parametrize("source", ["INVENTORY", "--hostfile"])
def test_special_and_oversized_files_are_refused_by_name(tmp_path: Path, source: str) -> None:
    for path, expected in _special_files(tmp_path):
        if source == "INVENTORY":
            with pytest.raises(InventoryError) as info:
                within_time(lambda p=path: load_inventory(p))
        else:
            with pytest.raises(InventoryError) as info:
                within_time(lambda p=path: load_cluster(HostSource(hostfile=p)))
        assert str(info.value).startswith(f"{path}") and expected in str(info.value), str(info.value)


def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "inventory.yaml"
    os.mkfifo(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(load_inventory, fifo)
        try:
            with pytest.raises(InventoryError, match=r"is a FIFO \(named pipe\), not a regular file"):
                future.result(timeout=10)
        finally:
            if not future.done():  # the loader is stuck in open(): give it a writer so that the thread ends
                os.close(os.open(fifo, os.O_WRONLY))


def test_check_command_refuses_devices_and_fifos_in_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    code, _, err = within_time(lambda: run_cli("check", str(fifo), "/dev/zero"))
    assert code == 2
    assert err.splitlines() == [
        f"{fifo}: is a FIFO (named pipe), not a regular file; write the inventory to a file and give that file's path",
        "/dev/zero: is a character device, not a regular file; write the inventory to a file and give that file's "
        "path",
    ]


# --- hostfiles and flags ----------------------------------------------------------------------------------------


@settings(FUZZ, max_examples=400)
@given(data=hostfile_bytes())
@example(data=b"worker-1 slots=" + b"9" * 5000)
@example(data=b"worker-1 " + b"k" * 20000 + b"=1")
@example(data=b"w\x1b[2J slots=1")
def test_mutated_hostfile_loads_or_names_file_and_line(workdir: Path, data: bytes) -> None:
    path = workdir / "hostfile"
    path.write_bytes(data)
    try:
        within_time(lambda: load_cluster(HostSource(hostfile=path)))
    except InventoryError as exc:
        assert_message_names(str(exc), (str(path),), lines=not str(exc).startswith(f"{path}: no hosts"))
    except UsageError as exc:  # values the inventory refuses (too many slots, ...) are named by the flag
        assert_message_names(str(exc), ("--hostfile",), lines=False)


def _flag_outcome(src: HostSource, flags: tuple[str, ...]) -> None:
    try:
        within_time(lambda: load_cluster(src, environ={}))
    except UsageError as exc:
        assert_message_names(str(exc), flags, lines=False)


@settings(FUZZ, max_examples=300)
@given(ips=ips_text(), gpus=st.none() | gpus_text(), nodes=st.none() | hostlist_text())
@example(ips="h:" + "9" * 5000, gpus=None, nodes=None)
@example(ips="10.0.0.1", gpus="0" * 5000 + "1", nodes=None)
@example(ips="10.0.0.1", gpus="0-" + "9" * 5000, nodes=None)
@example(ips="10.0.0.1", gpus=None, nodes="n[" + "0" * 5000 + "1]")
def test_ips_gpus_and_nodes_flags_load_or_name_the_flag(ips: str, gpus: str | None, nodes: str | None) -> None:
    _flag_outcome(HostSource(ips=ips, gpus=gpus, nodes=nodes), ("--ips", "--gpus", "--nodes"))


@settings(FUZZ, max_examples=300)
@given(nodelist=hostlist_text(), gpus=st.none() | gpus_text())
@example(nodelist="n[" + "0" * 5000 + "1]", gpus=None)
@example(nodelist="n[1-" + "9" * 5000 + "]", gpus=None)
@example(nodelist="n[" + "0" * 4000 + "1-65535]", gpus=None)
@example(nodelist="n" + "x" * 300, gpus=None)
def test_slurm_host_lists_load_or_name_the_flag(nodelist: str, gpus: str | None) -> None:
    _flag_outcome(HostSource(slurm=nodelist, gpus=gpus), ("--slurm", "--gpus", "SLURM_JOB_NODELIST"))


@settings(FUZZ, max_examples=150)
@given(user=st.none() | _HOSTY, python=st.none() | st.text(_NASTY_CHARS + "/abc", max_size=20),
       data_nic=st.none() | st.sampled_from(["eth0", "10.0.0.0/24", "10.0.0.0/33", "e\x00", "x" * 100, " ", "auto"]))
def test_node_setting_flags_load_or_name_the_flag(user: str | None, python: str | None, data_nic: str | None) -> None:
    _flag_outcome(HostSource(ips="10.0.0.1,10.0.0.2", ssh_user=user, python=python, data_nic=data_nic),
                  ("--ssh-user", "--python", "--data-nic", "--ips"))


@settings(FUZZ, max_examples=60)
@given(env=st.lists(st.tuples(_ENV_NAMES, st.sampled_from(["=", ""]), _ENV_VALUES).map("".join).map(_argv), max_size=3),
       gpus=st.none() | gpus_text().map(_argv), slurm=st.none() | hostlist_text().map(_argv))
def test_plan_command_names_the_env_gpus_or_host_flag(env: list[str], gpus: str | None, slurm: str | None) -> None:
    argv = ["plan", *(["--slurm", slurm] if slurm else ["--ips", "10.0.0.1"])]
    argv += [*(["--gpus", gpus] if gpus is not None else []), *[a for item in env for a in ("-e", item)]]
    code, _, err = within_time(lambda: run_cli(*argv, "--json", TRAIN))
    assert code in (0, 2), err
    if code == 2 and err.startswith("Usage: "):  # click's own: a value it took for an option, like --slurm -x
        assert err.rstrip("\n").split("\n")[-1].startswith("Error: ")
        assert all(row.isprintable() for row in err.rstrip("\n").split("\n")), err
    elif code == 2:
        message = err.rstrip("\n").removeprefix("clusterrun: error: ")
        if message.startswith("no such option: "):  # --slurm took no value and its neighbour was read as an option
            assert message.isprintable(), message
            return
        assert_message_names(message, ("--env", "--gpus", "--slurm", "--ips", "SLURM_JOB_NODELIST"), lines=False)


@pytest.mark.parametrize("value", ["x\x1b[2J", "a\rb", "\x00", "z\u2028"])
def test_env_flag_refuses_control_characters(value: str) -> None:
    code, _, err = run_cli("plan", "--ips", "10.0.0.1", "-e", f"A={value}", "--json", TRAIN)
    assert code == 2 and err.startswith("clusterrun: error: --env ") and ("control character" in err or "NUL" in err)
    assert err.rstrip("\n").isprintable(), err


def test_slurm_value_longer_than_a_file_name_is_a_host_list_not_a_crash() -> None:
    code, _, err = run_cli("plan", "--slurm", "n" + "x" * 300, "--json", TRAIN)
    assert code == 2 and err.startswith("clusterrun: error: --slurm"), err
