"""Failure hints from real NCCL and Gloo log lines."""

from __future__ import annotations

from clusterrun.facts.hints import failure_hints


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
