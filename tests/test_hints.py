"""Failure hints from real NCCL and Gloo log lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.facts.hints import chosen_interfaces, failure_hints


def test_gloo_connection_refused() -> None:
    lines = ["Traceback (most recent call last):",
             "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:144] connect [198.19.0.10]:29400: "
             "Connection refused"]
    (hint,) = failure_hints(lines)
    assert "refused" in hint and "master" in hint


def test_no_route() -> None:
    assert "no route" in failure_hints(["RuntimeError: ... No route to host"])[0]


def test_nccl_socket_failure_uses_the_nccl_parser() -> None:
    lines = ["node1:1234:1250 [0] NCCL INFO Bootstrap : Using eth1:10.0.0.2<0>",
             "node1:1234:1250 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.1<43411> "
             "failed : Software caused connection abort"]
    hints = failure_hints(lines)
    assert hints and all(isinstance(h, str) and h for h in hints)


def test_clean_log_gives_no_hint() -> None:
    assert failure_hints(["epoch 1 loss 0.5", "done"]) == []


# --- NCCL on the loopback interface ---------------------------------------------------------------------------------

NCCL_LOGS = Path(__file__).parent / "fixtures" / "real" / "nccl_log"
# torch's TCPStore timing out, as printed in https://github.com/vllm-project/vllm/issues/19670.
STORE_TIMEOUT = ("[E616 02:08:15.931416442 socket.cpp:1023] [c10d] The client socket has timed out after 600000ms "
                 "while trying to connect to (172.17.0.9, 50437).")


def nccl_log(name: str) -> list[str]:
    return (NCCL_LOGS / name).read_text().splitlines()


def test_loopback_chosen_and_connect_timeout_points_at_socket_ifname_first() -> None:
    hints = failure_hints(nccl_log("info_loopback_chosen_connect_timeout_old_nccl.txt"))

    assert "NCCL_SOCKET_IFNAME" in hints[0] and "loopback interface lo:127.0.0.1" in hints[0]
    assert "(of lo, eth0, eth1)" in hints[0]  # what NCCL chose, as it said
    assert not any("NCCL_SOCKET_IFNAME" in h for h in hints[1:])  # the generic hints come after, if at all


def test_loopback_hint_never_names_an_interface_with_only_a_link_local_address() -> None:
    # NCCL listed eth1 with fe80::215:5dff:fe33:ff6d only: no other node reaches it; eth0 has an IPv4 address.
    (hint, *_) = failure_hints(nccl_log("info_loopback_chosen_connect_timeout_old_nccl.txt"))

    assert "(such as eth0, which has 10.151.40.240; never lo)" in hint
    assert "eth1" not in hint.split("(of lo, eth0, eth1)")[1]


def test_loopback_hint_names_the_nodes_own_ipv4_nic_when_it_is_known() -> None:
    nics = [("ib0", "fe80::1"), ("lo", "127.0.0.1"), ("docker0", "172.17.0.1/16"), ("ens6", "198.19.0.12/24"),
            ("eno1", "198.18.0.12/24")]

    (hint, *_) = failure_hints(nccl_log("info_loopback_chosen_connect_timeout_old_nccl.txt"), nics=nics)

    assert "(such as ens6, which has 198.19.0.12; never lo)" in hint


def test_loopback_hint_without_a_known_ipv4_nic_names_none() -> None:
    # NCCL listed only lo; nothing is known of the node's NICs: the advice says how to find the right one.
    hints = failure_hints([*nccl_log("info_socket_ifname_lo.txt"), STORE_TIMEOUT], nics=[("eth1", "fe80::2")])

    assert "such as" not in hints[0]
    assert "(the interface that `ip -4 addr` shows with the node's address on the data network; never lo)" in hints[0]


def test_loopback_from_the_environment_and_a_store_timeout_names_the_setting() -> None:
    # Lines of two real logs: NCCL told to use lo, and torch's store timing out.
    hints = failure_hints([*nccl_log("info_socket_ifname_lo.txt"), STORE_TIMEOUT])

    assert hints[0].startswith("NCCL_SOCKET_IFNAME=lo (from the environment or nccl.conf) makes NCCL use the "
                               "loopback interface lo:127.0.0.1")
    assert "rendezvous timed out" in hints[1]


def test_loopback_without_a_failure_gives_no_hint() -> None:
    assert failure_hints(nccl_log("info_socket_ifname_lo.txt")) == []


def test_loopback_on_a_single_node_is_not_blamed_for_a_timeout() -> None:
    # Synthetic: NCCL's own count of nodes (the "nNodes" of its init line) says the job had one node.
    lines = ["n0:1:1 [0] NCCL INFO Bootstrap : Using lo:127.0.0.1<0>",
             "n0:1:2 [0] NCCL INFO comm 0x55d0 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
             STORE_TIMEOUT]

    assert not any("loopback" in h for h in failure_hints(lines))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("info_loopback_chosen_connect_timeout_old_nccl.txt",
         [("lo", "127.0.0.1"), ("eth0", "10.151.40.240"), ("eth1", "fe80::215:5dff:fe33:ff6d%eth1")]),
        ("info_socket_ifname_lo.txt", [("lo", "127.0.0.1")]),
        ("info_single_node_init_complete_nccl_2_4.txt", [("eno1", "192.168.50.11")]),
        ("info_net_interface_selection.txt",  # sockets of a plugin, an IB line's OOB interfaces, plain sockets
         [("ibs108", "10.0.19.12"), ("ibs109", "10.0.19.13"), ("ibs110", "10.0.19.14"), ("ibs111", "10.0.19.15"),
          ("ibs112", "10.0.19.16"), ("ibs113", "10.0.19.17"), ("ibs114", "10.0.19.18"), ("ibs115", "10.0.19.19"),
          ("eno1", "101.262.0.9"), ("ibp25s0", "10.0.12.82"), ("eth0", "10.0.0.23")]),
    ],
)
def test_chosen_interfaces_in_every_format_nccl_printed(name: str, expected: list[tuple[str, str]]) -> None:
    assert chosen_interfaces((NCCL_LOGS / name).read_text()) == expected


# --- torch's desync report -----------------------------------------------------------------------------------------


def test_desync_report_names_the_rank_that_never_joined_before_the_generic_timeout_hints() -> None:
    hints = failure_hints(nccl_log("torch_watchdog_timeout_desync_report.txt"))

    assert hints[0].startswith("the desync report names rank 7 as never joining collective #183 (after "
                               "finishing #182)")
    assert "rank 7's log" in hints[0]
    assert any("watchdog" in h for h in hints[1:])


def test_watchdog_timeout_without_a_desync_report_names_no_rank() -> None:
    hints = failure_hints(nccl_log("torch_watchdog_timeout_broadcast.txt"))

    assert hints and not any("desync report" in h for h in hints)


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (["\t - To our best knowledge, ranks [3, 5] are the lagging ranks that caused this timeout. They never "
          "joined any collectives"], "the desync report names ranks 3, 5 as never joining any collective"),
        # A rank inside the collective the others finished is the culprit, not the ranks waiting for it.
        (["\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:",
          "\t   - [47] joined but didn't finish collective #41207 (count from 1)",
          "\t     [0, 1, 2] finished collective #41207, but didn't join collective #41208 (count from 1)"],
         "the desync report names rank 47 as joining collective #41207 but never finishing it"),
    ],
    ids=["never-joined-any", "joined-not-finished"],
)
def test_desync_report_phrasings_of_torch(report: list[str], expected: str) -> None:
    # Built from the format strings of torch's TraceUtils.h (retrieveDesyncReport), which print these lines.
    watchdog = ("[rank0]:[E515 18:36:47.341808597 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=241, OpType=ALLREDUCE, NumelIn=6, NumelOut=6, "
                "Timeout(ms)=600000) ran for 600086 milliseconds before timing out.")
    assert failure_hints([watchdog, *report])[0].startswith(expected)
