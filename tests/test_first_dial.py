"""``clusterrun up INVENTORY SCRIPT`` dials the nodes' sshd before the rest of clusterrun loads
(clusterrun/cli/first_dial.py, clusterrun/transport/ssh/dial.py), and the SSH transport carries on over that
connection; every other command line dials nothing."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import click
import pytest
from loadscale import scaled
from simcluster import SimCluster
from simjobs import write_inventory

from clusterrun.cli import first_dial
from clusterrun.cli.up_cmd import up
from clusterrun.transport.ssh import dial


def test_the_options_read_as_taking_a_value_are_ups_own() -> None:
    # A new option of `up` that takes a value must be listed, or the token after it would be taken for the
    # inventory (a wrong guess dials nothing harmful, but dials nothing useful either).
    takes_value = {o for p in up.params if isinstance(p, click.Option) and not p.is_flag and not p.count
                   for o in (*p.opts, *p.secondary_opts)}
    assert takes_value == first_dial.VALUE_OPTIONS | (takes_value & first_dial.OTHER_OPTIONS)
    flags = {o for p in up.params if isinstance(p, click.Option) and (p.is_flag or p.count)
             for o in (*p.opts, *p.secondary_opts)}
    assert not flags & first_dial.VALUE_OPTIONS


def test_only_ups_plain_form_names_an_inventory(tmp_path: Path) -> None:
    inv = tmp_path / "cluster.yaml"
    inv.write_text("nodes: []\n")
    plain = str(inv)
    assert first_dial.inventory_of(["up", plain, "train.py"]) == plain
    assert first_dial.inventory_of(["up", "-q", "--nproc-per-node", "2", "--env=A=1", plain, "train.py", "--lr", "1"]) \
        == plain
    assert first_dial.inventory_of(["up", "--detach", "-e", "A=1", plain, "train.py"]) == plain
    for argv in (["doctor", plain], ["up", "--dry-run", plain, "t.py"], ["up", "--ips", "a,b", "t.py"],
                 ["up", "train.py"], ["up", str(tmp_path / "missing.yaml"), "t.py"], ["up", "--help"],
                 ["up", "--ssh-config", "x", plain, "t.py"], ["up", "--nproc-per-node", plain, "t.py"]):
        assert first_dial.inventory_of(argv) is None, argv


def test_a_dialled_connection_is_taken_once_and_a_refused_one_hands_its_error_over() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        dial.dial("127.0.0.1", port, 5.0)
        sock, began = dial.take("127.0.0.1", port, 5.0)  # type: ignore[misc]
        with sock:
            peer, _ = server.accept()
            with peer:
                sock.sendall(b"x")
                assert peer.recv(1) == b"x" and began > 0
        assert dial.take("127.0.0.1", port, 5.0) is None  # taken: the next connection dials by itself
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    dial.dial("127.0.0.1", port, 5.0)
    with pytest.raises(OSError):
        dial.take("127.0.0.1", port, 5.0)


@pytest.mark.cluster
def test_the_transport_carries_on_over_the_connection_dialled_first(sim_cluster: SimCluster, tmp_path: Path) -> None:
    from clusterrun.inventory.yaml_source import load_inventory
    from clusterrun.transport.factory import transport_for

    inv_path = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    assert first_dial.dial_nodes(["up", str(inv_path), "train.py"]) == 2
    deadline = time.monotonic() + scaled(30)  # each host is resolved (`ssh -G`) in a thread of its own, then dialled
    while len(dial.dialled()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(dial.dialled()) == 2
    inv = load_inventory(inv_path)
    for node in inv.nodes:
        with transport_for(inv, node) as transport:
            done = transport.run(["hostname"])
            assert done.ok and done.stdout.strip() == node.name
            assert transport.dialled is not None  # its TCP connection is the one dialled first
    dial.forget()


def test_dialling_first_loads_neither_pydantic_nor_paramiko_nor_click() -> None:
    # What makes the dial early: everything it imports is the standard library, PyYAML and clusterrun's own
    # ssh_config reader (`python -m clusterrun` runs clusterrun/__main__.py, which dials before the CLI loads).
    import subprocess
    import sys

    probe = ("import sys, clusterrun.__main__ as m\n"
             "from clusterrun.cli import first_dial\n"
             "import yaml\n"
             "from clusterrun.transport.ssh import config, dial, resolve, words\n"
             "print(sorted(n for n in ('pydantic', 'paramiko', 'click', 'rich') if n in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_giving_up_the_dials_wakes_a_connect_waiting_on_one() -> None:
    # A listener whose queue is full drops the next SYN: that dial waits (as for a node that drops every packet).
    # The command ending gives it up (EarlyConnections.close calls forget), and the transport waiting to take it
    # hears so at once instead of after its connect timeout.
    import threading

    with socket.create_server(("127.0.0.1", 0), backlog=0) as server:
        port = server.getsockname()[1]
        queued = []
        for _ in range(8):  # fill the accept queue: the kernel keeps backlog + 1
            try:
                queued.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
            except OSError:
                break
        try:
            dial.dial("127.0.0.1", port, 60.0)
            got: list[BaseException] = []

            def taker() -> None:
                try:
                    dial.take("127.0.0.1", port, 60.0)
                except OSError as exc:
                    got.append(exc)

            thread = threading.Thread(target=taker)
            thread.start()
            deadline = time.monotonic() + scaled(10)  # until the taker holds the dial (taken, still under way)
            while dial.dialled() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not dial.dialled() and thread.is_alive()
            dial.forget()
            thread.join(timeout=scaled(10))
            assert not thread.is_alive() and got and "given up" in str(got[0])
        finally:
            for sock in queued:
                sock.close()
