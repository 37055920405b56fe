"""What the pair checks learn and share (pure): when a node counts as dead on a network, which pairs are then left
out, how long a ping may wait, and how the judges tell a dead node once with the peers it was not tried with."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from clusterrun.doctor.checks.net import Transfer, _judge_bandwidth
from clusterrun.doctor.checks.paths import DEAD_AFTER_PEERS, Endpoint, Network, PathLedger, live_pairs
from clusterrun.doctor.checks.ping import _SCRIPT, MARK, PingOutcome, _judge_pings, ping_deadline, split_sections
from clusterrun.doctor.model import Evidence, Verdict
from clusterrun.doctor.registry import Context
from clusterrun.facts.parsers import ping
from clusterrun.inventory.models import Inventory

PINGS = Path(__file__).parent / "fixtures" / "real" / "ping"
SUBNET = "10.0.0.0/24"
NODES = ("n0", "n1", "n2", "n3")
DATA = Network(SUBNET, {n: Endpoint(n, "eth1", f"10.0.0.{i + 1}") for i, n in enumerate(NODES)}, data=True)


def ledger(*tests: tuple[str, str, bool]) -> PathLedger:
    book = PathLedger()
    for a, b, ok in tests:
        book.record(SUBNET, a, b, ok)
    return book


@pytest.mark.parametrize(
    ("tests", "dead"),
    [
        ([("n0", "n3", True), ("n1", "n2", False), ("n0", "n2", False), ("n3", "n1", True)], {"n2"}),
        ([("n0", "n3", True), ("n1", "n2", False)], set()),  # one peer: the pair or either node
        ([("n1", "n2", False), ("n0", "n2", False)], set()),  # its peers reached nobody else: no common factor
        ([("n0", "n3", True), ("n1", "n2", False), ("n0", "n2", False), ("n3", "n1", True), ("n2", "n3", True)],
         set()),  # it reached a peer: a pair problem, not a dead NIC
        ([("n0", "n1", True), ("n2", "n3", True), ("n0", "n2", False), ("n1", "n3", False), ("n0", "n3", False),
          ("n1", "n2", False)], set()),  # everyone reached someone: pair problems only
    ],
    ids=["fails-with-two-working-peers", "one-peer", "peers-reach-nobody", "reached-one", "pair-problems"],
)
def test_a_node_is_dead_only_when_it_is_the_common_factor(tests: list[tuple[str, str, bool]], dead: set[str]) -> None:
    assert ledger(*tests).dead(SUBNET) == dead
    assert DEAD_AFTER_PEERS == 2


def test_dead_on_one_network_is_not_dead_on_another() -> None:
    book = ledger(("n0", "n3", True), ("n1", "n2", False), ("n0", "n2", False), ("n3", "n1", True))

    assert book.dead(SUBNET) == {"n2"}
    assert book.dead("192.168.1.0/24") == set()


def test_pairs_with_a_dead_node_are_left_out_and_the_others_kept() -> None:
    keep, left = live_pairs([("n0", "n1"), ("n2", "n3")], {"n2"})

    assert (keep, left) == ([("n0", "n1")], [("n2", "n3")])
    assert live_pairs([("n0", "n1")], set()) == ([("n0", "n1")], [])


@pytest.mark.parametrize(("count", "deadline"), [(1, 1), (3, 2), (5, 2), (10, 3)])
def test_a_ping_waits_for_its_packets_and_one_second_more(count: int, deadline: int) -> None:
    assert ping_deadline(count) == deadline


def _ping(src: str, dst: str, ok: bool) -> PingOutcome:
    """A ping outcome from recorded real output (tests/fixtures/real/ping/)."""
    text = (PINGS / ("loopback_ok.txt" if ok else "all_dropped.txt")).read_text()
    return PingOutcome(DATA, DATA.members[src], DATA.members[dst], ping.parse(text), None,
                       Evidence(f"ping {dst}", text, 0 if ok else 1, src))


def test_ping_judge_names_the_dead_node_once_with_the_peers_not_tried() -> None:
    both = [("n0", "n3"), ("n1", "n2"), ("n0", "n2"), ("n3", "n1")]  # the first two rounds of four nodes
    outcomes = [_ping(s, d, "n2" not in (s, d)) for a, b in both for s, d in ((a, b), (b, a))]
    found = list(_judge_pings([DATA], outcomes, {SUBNET: {"n2": {"n3"}, "n3": {"n2"}}}))

    assert len(found) == 1
    fail = found[0]
    assert (fail.verdict, fail.node, fail.subject) == (Verdict.failed, "n2", "eth1")
    assert fail.summary == "n2: eth1 (10.0.0.3) reaches no peer on 10.0.0.0/24 (2 peer(s) tried both ways; 1 more " \
                           "not tried)"
    assert fail.data == {"unreachable_peers": ["n0", "n1"], "untried_peers": ["n3"]}


def test_bandwidth_judge_tells_a_dead_node_once_and_judges_the_rest() -> None:
    inv = Inventory.model_validate({"nodes": [{"name": n, "host": f"192.168.1.{i + 1}"} for i, n in enumerate(NODES)]})
    ctx = Context(inv, {})
    failed = [Transfer(s, d, None, "iperf3", f"{s} cannot connect to x (timed out after 3s)", (), False)
              for s, d in (("n1", "n2"), ("n2", "n1"), ("n0", "n2"), ("n2", "n0"))]
    good = [Transfer(s, d, 1.9e9, "iperf3", None, (), True) for s, d in (("n0", "n3"), ("n3", "n0"), ("n3", "n1"),
                                                                         ("n1", "n3"))]
    found = list(_judge_bandwidth(ctx, DATA, failed + good, "iperf3", {"n2"}, {"n2": {"n3"}, "n3": {"n2"}}))

    fails = [f for f in found if f.verdict is Verdict.failed]
    assert [(f.node, f.subject) for f in fails] == [("n2", "eth1")]
    assert fails[0].summary == "n2: eth1 (10.0.0.3) connects to no peer on 10.0.0.0/24; not measured " \
                               "(4 transfer(s) failed, 1 peer(s) not tried)"
    assert fails[0].data == {"failed_peers": ["n0", "n1"], "untried_peers": ["n3"]}
    assert [f.verdict for f in found if f.verdict is not Verdict.failed] == [Verdict.passed]
    assert "over 4 transfer(s)" in found[-1].summary


def test_a_ping_whose_output_was_cut_short_counts_by_its_exit_status() -> None:
    # ping exits 0 only when every packet was answered; the statistics lines may be missing from what came back.
    cut = "PING 10.0.0.2 (10.0.0.2) from 10.0.0.1 : 56(84) bytes of data.\n64 bytes from 10.0.0.2: icmp_seq=1 ttl=64\n"
    answered = PingOutcome(DATA, DATA.members["n0"], DATA.members["n1"], None, None, Evidence("ping", cut, 0, "n0"),
                           answered=True)
    outcomes = [answered, _ping("n1", "n0", True)]
    found = list(_judge_pings([DATA], outcomes))

    assert answered.ok
    assert [f.verdict for f in found] == [Verdict.passed]
    assert "all 2 directed pairs answer" in found[0].summary


def _run_node_program(pairs: list[tuple[str, str]], at_once: int) -> tuple[int, str]:
    """The ping check's node program, run here on loopback addresses."""
    args = ["1", "0.2", str(ping_deadline(1)), str(at_once)] + [a for pair in pairs for a in pair]
    done = subprocess.run(["sh", "-c", _SCRIPT, "sh", *args], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout


@pytest.mark.skipif(shutil.which("ping") is None, reason="needs ping (iputils-ping)")
def test_the_node_program_runs_every_ping_and_returns_each_output_with_its_exit_status() -> None:
    pairs = [("127.0.0.1", f"127.0.0.{i}") for i in range(1, 6)]  # five pings, two at a time
    rc, out = _run_node_program(pairs, at_once=2)

    assert rc == 0
    sections = split_sections(out, len(pairs))
    assert sorted(sections) == [0, 1, 2, 3, 4]
    for i, (code, text) in sections.items():
        assert code == 0
        result = ping.parse(text)
        assert result.received == 1 and f"127.0.0.{i + 1}" in text


def test_sections_cut_short_or_out_of_range_are_missing_not_misread() -> None:
    text = (f"{MARK} 0 0\nPING a\n1 packets transmitted, 1 received\n{MARK} 7 0\nstray\n"
            f"{MARK} 1 1\nPING b\n{MARK} x 0\n")
    sections = split_sections(text, 2)

    assert sections == {0: (0, "PING a\n1 packets transmitted, 1 received\n"), 1: (1, f"PING b\n{MARK} x 0\n")}
    assert split_sections("sh: mktemp: not found\n", 3) == {}
