"""The node's sampler (clusterrun/remote/sampler.py) on /sys and /proc trees built here, and its GPU loop on a
stand-in nvidia-smi (tests/standins/nvidia_smi_loop.py): rates, gaps with reasons, never a crash or a stall."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import pytest
from loadscale import scaled

from clusterrun.remote import gpuloop, ranksockets, sampler
from clusterrun.runs import traffic

STANDIN = Path(__file__).resolve().parent / "standins" / "nvidia_smi_loop.py"
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def nic(root: Path, name: str, rx: int, tx: int) -> None:
    _write(root / "class" / "net" / name / "statistics" / "rx_bytes", f"{rx}\n")
    _write(root / "class" / "net" / name / "statistics" / "tx_bytes", f"{tx}\n")


def hca(root: Path, name: str, port: int, rcv: int, xmit: int) -> None:
    counters = root / "class" / "infiniband" / name / "ports" / str(port) / "counters"
    _write(counters / "port_rcv_data", f"{rcv}\n")
    _write(counters / "port_xmit_data", f"{xmit}\n")


def _hex4(address: str) -> str:
    return socket.inet_aton(address)[::-1].hex().upper()


def rank(proc: Path, pid: int, cpu_ticks: int, rss_pages: int, env: dict[str, str] | None = None,
         sockets: tuple[int, ...] = ()) -> None:
    fields = ["S"] + ["0"] * 50
    fields[11], fields[21] = str(cpu_ticks), str(rss_pages)
    _write(proc / str(pid) / "stat", f"{pid} (python 3) " + " ".join(fields) + "\n")
    _write(proc / str(pid) / "environ", "".join(f"{k}={v}\0" for k, v in (env or {}).items()))
    fd = proc / str(pid) / "fd"
    fd.mkdir(parents=True, exist_ok=True)
    for i, inode in enumerate(sockets):
        if not (fd / str(10 + i)).is_symlink():
            os.symlink(f"socket:[{inode}]", fd / str(10 + i))
    os.symlink("/dev/null", fd / "0") if not (fd / "0").is_symlink() else None


def net(proc: Path, pid: int, conns: list[tuple[str, int, str, int, int]], routes: list[tuple[str, str, str]]) -> None:
    """``/proc/<pid>/net``: tcp (local, lport, remote, rport, inode; established) and route (nic, network, mask)."""
    lines = ["  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"]
    for i, (local, lport, remote, rport, inode) in enumerate(conns):
        lines.append(f"   {i}: {_hex4(local)}:{lport:04X} {_hex4(remote)}:{rport:04X} 01 00000000:00000000 "
                     f"00:00000000 00000000  1000        0 {inode} 1 0000000000000000 20 4 30 10 -1")
    lines.append(f"   9: {_hex4('0.0.0.0')}:1F90 {_hex4('0.0.0.0')}:0000 0A 00000000:00000000 00:00000000 00000000  "
                 "1000        0 999 1 0000000000000000 100 0 0 10 0")  # a listening socket: not a connection
    _write(proc / str(pid) / "net" / "tcp", "\n".join(lines) + "\n")
    _write(proc / str(pid) / "net" / "tcp6", "  sl  local_address remote_address st\n")
    route = ["Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT"]
    route.append("eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0")
    for name, network, mask in routes:
        route.append(f"{name}\t{_hex4(network)}\t00000000\t0001\t0\t0\t0\t{_hex4(mask)}\t0\t0\t0")
    _write(proc / str(pid) / "net" / "route", "\n".join(route) + "\n")


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    sys_root, proc = tmp_path / "sys", tmp_path / "proc"
    nic(sys_root, "eth0", 1000, 2000)
    nic(sys_root, "eth1", 0, 0)
    _write(proc / "loadavg", "3.50 2.00 1.00 2/300 4242\n")
    return sys_root, proc


def test_rates_per_nic_rdma_port_and_rank(tree: tuple[Path, Path]) -> None:
    sys_root, proc = tree
    hca(sys_root, "mlx5_0", 1, 100, 200)
    rank(proc, 4242, cpu_ticks=0, rss_pages=1000, env={"GLOO_SOCKET_IFNAME": "eth0", "HOME": "/root"})
    s = sampler.Sampler(lambda: {8: 4242}, sys_root=str(sys_root), proc=str(proc), smi="", diag=False)
    first = s.sample(now=100.0, wall=1000.0)
    assert "nics" not in first and first["ranks"]["8"]["rss"] == 1000 * PAGE
    nic(sys_root, "eth0", 1000 + 5_000_000, 2000 + 1_000_000)
    nic(sys_root, "eth1", 2_000_000_000, 3_000_000_000)
    hca(sys_root, "mlx5_0", 1, 100 + 250, 200 + 500)
    rank(proc, 4242, cpu_ticks=TICK, rss_pages=2000)
    second = s.sample(now=102.0, wall=1002.0)
    assert second["dt"] == 2.0 and second["t"] == 1002.0
    assert second["nics"] == {"eth0": [2_500_000, 500_000], "eth1": [1_000_000_000, 1_500_000_000]}
    assert second["rdma"] == {"mlx5_0/1": [500, 1000]}  # 4-byte units
    assert second["ranks"]["8"] == {"pid": 4242, "rss": 2000 * PAGE, "cpu": 0.5}
    assert second["load"] == 3.5
    assert second["env"] == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert "gaps" not in second


def test_a_counter_that_wraps_at_32_bits_is_a_rate_one_that_resets_is_a_gap(tree: tuple[Path, Path]) -> None:
    sys_root, proc = tree
    nic(sys_root, "eth0", (1 << 32) - 1000, 0)
    nic(sys_root, "eth1", 10_000_000_000, 0)
    s = sampler.Sampler(dict, sys_root=str(sys_root), proc=str(proc), smi="", diag=False)
    s.sample(now=1.0)
    nic(sys_root, "eth0", 3000, 0)
    nic(sys_root, "eth1", 5000, 0)
    got = s.sample(now=2.0)
    assert got["nics"]["eth0"] == [4000, 0]
    assert "eth1" not in got["nics"] and "reset" in got["gaps"]["nic eth1"]
    nic(sys_root, "eth1", 6000, 0)
    assert s.sample(now=3.0)["nics"]["eth1"] == [1000, 0]  # counted again from the reset on


def test_a_vanished_nic_and_a_saturated_port_are_gaps_the_rest_goes_on(tree: tuple[Path, Path]) -> None:
    sys_root, proc = tree
    hca(sys_root, "mlx4_0", 1, (1 << 32) - 1, 0)
    s = sampler.Sampler(dict, sys_root=str(sys_root), proc=str(proc), smi="", diag=False)
    s.sample(now=1.0)
    shutil.rmtree(sys_root / "class" / "net" / "eth1")
    got = s.sample(now=2.0)
    assert got["gaps"]["nic eth1"].startswith("gone")
    assert "saturated" in got["gaps"]["rdma mlx4_0/1"]
    assert got["nics"] == {"eth0": [0, 0]}
    assert "nic eth1" not in s.sample(now=3.0).get("gaps", {})  # said once


def test_missing_sys_and_a_rank_gone_are_gaps_not_errors(tmp_path: Path) -> None:
    s = sampler.Sampler(lambda: {0: 999999}, sys_root=str(tmp_path / "nosys"), proc=str(tmp_path / "noproc"),
                        smi="", diag=False)
    got = s.sample(now=1.0)
    assert "cannot read" in got["gaps"]["nics"]
    assert got["gaps"]["rank 0"] == "pid 999999 gone"
    assert "loadavg" in got["gaps"]["load"]


def test_rank_sockets_are_mapped_to_the_nic_owning_their_local_address(tree: tuple[Path, Path]) -> None:
    sys_root, proc = tree
    rank(proc, 4242, 0, 10, env={"MASTER_PORT": "29500"}, sockets=(501, 502, 503, 504))
    net(proc, 4242, [("10.0.0.1", 40000, "10.0.0.2", 41000, 501),     # to a peer, management NIC
                     ("10.0.0.1", 40001, "10.0.0.2", 41001, 502),
                     ("192.168.9.1", 40002, "192.168.9.2", 41002, 503),  # data NIC
                     ("10.0.0.1", 40003, "10.0.0.9", 29500, 504),      # torchrun's store: not counted
                     ("10.0.0.1", 22, "10.0.0.7", 50000, 777)],        # sshd's, not a rank's
        routes=[("eth0", "10.0.0.0", "255.255.255.0"), ("eth1", "192.168.9.0", "255.255.255.0")])
    s = sampler.Sampler(lambda: {0: 4242}, sys_root=str(sys_root), proc=str(proc), smi="", diag=False)
    got = s.sample(now=1.0)
    assert got["conns"] == {"eth0": {"10.0.0.1>10.0.0.2": {"n": 2}}, "eth1": {"192.168.9.1>192.168.9.2": {"n": 1}}}


def test_kernel_socket_counters_give_the_bytes_of_each_rank_connection() -> None:
    # A real connection of this process, read through the kernel's socket diagnostics: an IPv4 client of a
    # dual-stack server, whose end is an IPv6 socket of a v4-mapped address (as Gloo's may be).
    if not socket.has_dualstack_ipv6():
        pytest.skip("no IPv6 here")
    server = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    client = socket.create_connection(("127.0.0.1", server.getsockname()[1]))
    peer, _ = server.accept()
    with server, client, peer:
        counters = ranksockets.diag_sockets()
        if counters is None:
            pytest.skip("this kernel refuses NETLINK_SOCK_DIAG")
        sockets = ranksockets.RankSockets()
        sockets.sample([os.getpid()], 0.0, now=1.0)
        sockets.sample([os.getpid()], 1.0, now=2.0)  # between two looks at the fds: the families in use only
        client.sendall(b"x" * 300_000)
        got = 0
        while got < 300_000:
            got += len(peer.recv(1 << 20))
        conns = sockets.sample([os.getpid()], 1.0, now=3.0)["lo"]
        pair = "127.0.0.1>127.0.0.1"
        assert conns[pair]["n"] == 2
        assert conns[pair]["tx"] >= 300_000 and conns[pair]["rx"] >= 300_000
        # A quiet sample (bytes not read) between two busy ones: the next busy one holds every byte since.
        quiet = sockets.sample([os.getpid()], 1.0, now=4.0, busy=False)["lo"]
        assert quiet[pair] == {"n": 2}
        client.sendall(b"y" * 200_000)
        got = 0
        while got < 200_000:
            got += len(peer.recv(1 << 20))
        busy = sockets.sample([os.getpid()], 0.5, now=4.5)["lo"]
        assert busy[pair]["tx"] * 0.5 >= 200_000 and busy[pair]["rx"] * 0.5 >= 200_000


def _standin(tmp_path: Path, mode: str = "ok", after: int = 2, apps: str = "") -> str:
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nSTANDIN_SMI_LOOP_MODE={mode} STANDIN_SMI_LOOP_AFTER={after} "
                    f"STANDIN_SMI_APPS='{apps}' exec {sys.executable} {STANDIN} \"$@\"\n")
    tool.chmod(0o755)
    return str(tool)


def _until(check, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout}s")


def test_gpu_loop_reads_each_gpu_with_its_energy_counter_and_the_other_processes(tmp_path: Path) -> None:
    apps = "00000000:02:00.0, 777, 5000;00000000:01:00.0, 4242, 30000"
    loop = gpuloop.GpuLoop(_standin(tmp_path, after=10**6, apps=apps), [0, 1], 0.1, apps_every=0.1)
    loop.start()
    try:
        readings, _, _ = _until(lambda: (r := loop.read()) and len(r[0]) == 2 and r[1] and r)
        assert readings[1] == {"util": 97.0, "mem": 30000.0, "power": 250.0, "temp": 61.0,
                               "energy": readings[1]["energy"]}
        _, apps_seen, why = loop.read()
        assert sorted(apps_seen) == [(0, 4242, 30000.0), (1, 777, 5000.0)] and why is None
    finally:
        loop.close()


def test_an_older_nvidia_smi_without_the_energy_field_still_gives_power(tmp_path: Path) -> None:
    loop = gpuloop.GpuLoop(_standin(tmp_path, "noenergy", after=10**6), [0], 0.1, apps_every=0)
    loop.start()
    try:
        readings = _until(lambda: loop.read()[0])
        assert readings[0]["power"] == 250.0 and "energy" not in readings[0]
    finally:
        loop.close()


def test_a_hanging_nvidia_smi_is_a_gap_killed_and_started_again_while_samples_go_on(
        tree: tuple[Path, Path], tmp_path: Path) -> None:
    sys_root, proc = tree
    s = sampler.Sampler(dict, gpus=[0], sys_root=str(sys_root), proc=str(proc), smi=_standin(tmp_path, "hang"),
                        diag=False, every=0.05, apps_every=0)
    s.gpu.silent_after, s.gpu.start_grace = 0.5, 10.0  # the stand-in is a Python: its start takes a while here
    samples: list[dict] = []
    stop = threading.Event()
    thread = s.start(0.05, samples.append, stop)
    try:
        _until(lambda: any("silent" in x.get("gaps", {}).get("gpus", "") for x in samples))
        hung = len(samples)
        _until(lambda: any("gpus" in x for x in samples[hung:]))  # started again: readings again
        assert len(samples) > hung  # the sampler never waited on it
    finally:
        stop.set()
        thread.join(timeout=scaled(10))
    assert not thread.is_alive()


def test_a_dying_nvidia_smi_is_a_gap_with_its_exit(tree: tuple[Path, Path], tmp_path: Path) -> None:
    loop = gpuloop.GpuLoop(_standin(tmp_path, "die"), [0], 0.05, apps_every=0)
    loop.start()
    try:
        why = _until(lambda: loop.read()[2])
        assert why.startswith("nvidia-smi ended (exit 3)")
    finally:
        loop.close()


def test_an_unforeseen_failure_is_a_gap_and_the_next_sample_comes(tree: tuple[Path, Path]) -> None:
    sys_root, proc = tree
    calls = []

    def ranks() -> dict[int, int]:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return {}

    s = sampler.Sampler(ranks, sys_root=str(sys_root), proc=str(proc), smi="", diag=False)
    samples: list[dict] = []
    stop = threading.Event()
    thread = s.start(0.01, samples.append, stop, until=lambda: len(samples) >= 3)
    thread.join(timeout=scaled(10))
    assert samples[0]["gaps"]["sampler"] == "RuntimeError: boom"
    assert "nics" in samples[1]


def test_the_hex_addresses_of_proc_net_tcp6_read_as_addresses() -> None:
    mapped = "0000000000000000FFFF00000100007F"  # ::ffff:127.0.0.1
    assert ranksockets._hex_ip(mapped) == "127.0.0.1"
    assert ranksockets._hex_ip("000080FE00000000FF0000020300FE04") == "fe80::200:ff:4fe:3"
    assert struct.calcsize("=BBBxI48x") == 56


def test_a_gpu_run_has_gpu_series_other_processes_and_an_energy_figure(tree: tuple[Path, Path], tmp_path: Path) -> None:
    sys_root, proc = tree
    rank(proc, 4242, 0, 10)
    apps = "00000000:02:00.0, 777, 5000;00000000:01:00.0, 4242, 30000"  # another user's job on GPU 1, our rank on 0
    s = sampler.Sampler(lambda: {0: 4242}, gpus=[0, 1], sys_root=str(sys_root), proc=str(proc),
                        smi=_standin(tmp_path, after=10**6, apps=apps), diag=False, every=0.1, apps_every=0.1)
    samples: list[dict] = []
    stop = threading.Event()
    thread = s.start(0.1, samples.append, stop)
    try:
        _until(lambda: sum(1 for x in samples if len(x.get("gpus", {})) == 2) >= 5 and "others" in samples[-1])
    finally:
        stop.set()
        thread.join(timeout=scaled(10))
    with_gpus = [x for x in samples if "gpus" in x]
    assert with_gpus[-1]["gpus"]["1"]["power"] == 250.0 and with_gpus[-1]["others"] == {"777": {"gpu": 1, "mem": 5000.0}}
    used = traffic.energy({"n": with_gpus})
    assert used.how["n"] in ("counter", "counter+power") and used.per_gpu["n"]["0"] > 0
