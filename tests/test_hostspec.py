"""Command-line host, GPU and environment lists: exact parses, and errors naming the flag and the item."""

from __future__ import annotations

import re

import pytest

from clusterrun.errors import UsageError
from clusterrun.inventory.hostspec import (
    MAX_GPU_INDEX,
    MAX_HOST_LENGTH,
    HostSpec,
    normalize_host,
    parse_env_assignments,
    parse_gpu_list,
    parse_ips,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # fleetrun's documented form
        ("192.168.0.16,192.168.0.17", [HostSpec("192.168.0.16"), HostSpec("192.168.0.17")]),
        ("10.0.0.1", [HostSpec("10.0.0.1")]),
        ("gpu-01,gpu-02.cluster.local", [HostSpec("gpu-01"), HostSpec("gpu-02.cluster.local")]),
        ("10.0.0.1:2222,node2:22", [HostSpec("10.0.0.1", 2222), HostSpec("node2", 22)]),
        ("[fe80::1]:2222", [HostSpec("fe80::1", 2222)]),
        ("[fe80::1]", [HostSpec("fe80::1")]),
        ("fe80::1", [HostSpec("fe80::1")]),
        ("FE80:0:0::1", [HostSpec("fe80::1")]),  # IPv6 in canonical form
        ("::1,[::1]:2200", [HostSpec("::1"), HostSpec("::1", 2200)]),
        ("fe80::1:2222", [HostSpec("fe80::1:2222")]),  # bare IPv6 never carries a port
        (" 10.0.0.1 ,  10.0.0.2:65535 ", [HostSpec("10.0.0.1"), HostSpec("10.0.0.2", 65535)]),
        ("localhost:1024,gpu-02:10022", [HostSpec("localhost", 1024), HostSpec("gpu-02", 10022)]),
        ("1node", [HostSpec("1node")]),
        ("a" * 63, [HostSpec("a" * 63)]),
        # Slurm node names and ssh_config aliases may hold underscores; ssh takes them
        ("gpu_01,rack0_blade2:2222", [HostSpec("gpu_01"), HostSpec("rack0_blade2", 2222)]),
        ("gpu_01.cluster.local", [HostSpec("gpu_01.cluster.local")]),
        ("gpu01.", [HostSpec("gpu01.")]),  # a fully qualified name with its root dot
        ("gpu-", [HostSpec("gpu-")]),
        ("gpü01", [HostSpec("gpü01")]),
        ("a" * 64, [HostSpec("a" * 64)]),  # no per-label limit: an alias is no DNS name
        (".".join(["a" * 63] * 4)[:MAX_HOST_LENGTH], [HostSpec(".".join(["a" * 63] * 4)[:MAX_HOST_LENGTH])]),
        # the same host on different ports is two nodes (containers behind port forwards)
        ("10.0.0.1:2222,10.0.0.1:2223", [HostSpec("10.0.0.1", 2222), HostSpec("10.0.0.1", 2223)]),
    ],
)
def test_parse_ips_accepts_hosts_ports_and_ipv6(value: str, expected: list[HostSpec]) -> None:
    assert parse_ips(value) == expected


@pytest.mark.parametrize(
    ("value", "offending", "problem"),
    [
        ("", None, "no hosts given"),
        ("  ", None, "no hosts given"),
        ("10.0.0.1,,10.0.0.2", "item 2 of '10.0.0.1,,10.0.0.2'", "is empty"),
        ("10.0.0.1,", "item 2 of '10.0.0.1,'", "is empty"),
        ("10.0.0.1:0", "'10.0.0.1:0'", "port 0 is out of range"),
        ("10.0.0.1:65536", "'10.0.0.1:65536'", "port 65536 is out of range"),
        ("node:ssh", "'node:ssh'", "port 'ssh' is not a number"),
        ("node:", "'node:'", "the port after ':' is empty"),
        ("node:-1", "'node:-1'", "port '-1' is not a number"),
        ("[fe80::1]:99999", "'[fe80::1]:99999'", "port 99999 is out of range"),
        ("10.0.0.1,10.0.0.2,10.0.0.1", "'10.0.0.1'", "listed twice (items 1 and 3)"),
        ("Node1,node1", "'node1'", "listed twice (items 1 and 2)"),
        ("[::1]:22,[0::1]:22", "'[0::1]:22'", "listed twice"),
        ("-gpu", "--ips: host '-gpu'", "starts with '-', which ssh would read as an option"),
        ("-oProxyCommand=x:22", "--ips: '-oProxyCommand=x:22': host '-oProxyCommand=x'", "starts with '-'"),
        ("user@gpu01", "host 'user@gpu01'", "holds '@'; give the host alone and the user with --ssh-user"),
        ("gpu\x0001", "host 'gpu\\x0001'", "holds a NUL character"),
        ("gpu\x1b[0m", "host 'gpu\\x1b[0m'", "holds the control character '\\x1b'"),
        ("\ufeffgpu01", "host '\\ufeffgpu01'", "holds the invisible character '\\ufeff'"),
        ("gpu\u200b01:22", "host 'gpu\\u200b01'", "holds the invisible character '\\u200b'"),
        ("gpu01;reboot", "host 'gpu01;reboot'", "holds ';', which ssh refuses in a host name"),
        ("gpu$(id)", "host 'gpu$(id)'", "holds '$', '(', ')', which ssh refuses"),
        ("gpu 01,x", "'gpu 01'", "separate hosts with commas"),
        ("a" * 254, "host 'aaaaaaaaaaaaaaaaaaaa'... (254 characters)", f"is longer than {MAX_HOST_LENGTH} characters"),
        ("gpu-02:" + "9" * 5000, "port 9999999999999999999999999999999999999999... (5000 characters)", "out of range"),
        ("gpu\t01", "'gpu\\t01'", "separate hosts with commas"),
        ("10.0.0.256", "'10.0.0.256'", "not a valid IPv4 address"),
        ("10.0.0", "'10.0.0'", "not a valid IPv4 address; write four numbers from 0 to 255"),
        ("010.0.0.1", "'010.0.0.1'", "not a valid IPv4 address"),
        ("42", "'42'", "not a valid IPv4 address"),  # ssh would connect to 0.0.0.42
        ("fe80::zz", "'fe80::zz'", "not a valid IPv6 address; to give an IPv6 address a port"),
        ("[10.0.0.1]:22", "'[10.0.0.1]:22'", "brackets are only for IPv6"),
        ("[fe80::1", "'[fe80::1'", "is not a host"),
        ("[fe80::1]2222", "'[fe80::1]2222'", "is not a host"),
        ("10.0.0.1 10.0.0.2", "'10.0.0.1 10.0.0.2'", "separate hosts with commas"),
        (":22", "':22'", "the host is empty"),
    ],
)
def test_parse_ips_errors_name_the_flag_and_item(value: str, offending: str | None, problem: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_ips(value)
    message = str(info.value)
    assert message.startswith("--ips")
    assert problem in message
    if offending is not None:
        assert offending in message


def test_mpi_slot_counts_are_refused_not_taken_for_ssh_ports() -> None:
    # mpirun's and Horovod's host:N gives N slots; it used to become ssh ports 2 and 3.
    with pytest.raises(UsageError) as info:
        parse_ips("a,b:2,c:3")
    message = str(info.value)
    assert message.startswith("--ips: b:2: MPI's slot count? clusterrun takes processes per node from "
                              "--nproc-per-node (or a hostfile's slots=N); an ssh port is written b:2222")
    assert "\n" not in message
    for item in ("gpu:1", "gpu:8", "gpu:256", "gpu:1023", "[fe80::1]:8"):
        with pytest.raises(UsageError, match="MPI's slot count"):
            parse_ips(item)


def test_real_ssh_ports_keep_working() -> None:
    assert parse_ips("a,b:2222,c:22,d:10022,[fe80::1]:1024") == [
        HostSpec("a"), HostSpec("b", 2222), HostSpec("c", 22), HostSpec("d", 10022), HostSpec("fe80::1", 1024)]


@pytest.mark.parametrize("bad", ["^node2", "*", "./gpu", ".gpu", "~gpu", "+gpu", "!gpu"])
def test_a_host_starting_with_what_no_host_name_starts_with_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=f"host {re.escape(repr(bad))} starts with {re.escape(repr(bad[0]))}, which "
                       "no host name does"):
        normalize_host(bad)


def test_parse_ips_names_the_flag_it_was_given() -> None:
    with pytest.raises(UsageError, match=r"^--hosts: host '-bad_host'"):
        parse_ips("-bad_host", flag="--hosts")


@pytest.mark.parametrize("bad", ["-gpu01", "gpu\x00", "gpu\n01", "gpu\x7f", "gpu 01", "a|b", "a,b", "u@h", ""])
def test_normalize_host_refuses_what_would_break_in_one_line(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        normalize_host(bad)
    message = str(info.value)
    assert "\n" not in message
    assert repr(bad) in message or bad == ""
    assert "; " in message  # what is wrong, then what to do


@pytest.mark.parametrize("name", ["gpu_01", "rack0_blade2", "GPU-01.Example.com", "login.", "my_alias-2", "n%1"])
def test_normalize_host_keeps_names_ssh_accepts_as_written(name: str) -> None:
    assert normalize_host(name) == name


@pytest.mark.parametrize(("spec", "text"), [
    (HostSpec("10.0.0.1"), "10.0.0.1"),
    (HostSpec("10.0.0.1", 22), "10.0.0.1:22"),
    (HostSpec("fe80::1", 2222), "[fe80::1]:2222"),
    (HostSpec("fe80::1"), "[fe80::1]"),
])
def test_hostspec_prints_as_it_is_written_on_the_command_line(spec: HostSpec, text: str) -> None:
    assert str(spec) == text
    assert parse_ips(text) == [spec]


def test_normalize_host_keeps_host_names_as_written() -> None:
    assert normalize_host("GPU-01.Example.com") == "GPU-01.Example.com"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0,1,2,3", (0, 1, 2, 3)),
        ("0-3", (0, 1, 2, 3)),
        ("0-1,4-5", (0, 1, 4, 5)),
        ("3,1", (3, 1)),
        ("7", (7,)),
        ("2-2", (2,)),
        (" 0 , 2-3 ", (0, 2, 3)),
        (f"{MAX_GPU_INDEX}", (MAX_GPU_INDEX,)),
    ],
)
def test_parse_gpu_list(value: str, expected: tuple[int, ...]) -> None:
    assert parse_gpu_list(value) == expected


@pytest.mark.parametrize(
    ("value", "offending", "problem"),
    [
        ("", None, "no GPUs given"),
        ("0,,1", "'' in '0,,1'", "is empty"),
        ("-1", "'-1'", "is negative"),
        ("0,-2", "'-2'", "is negative"),
        ("gpu0", "'gpu0'", "is not an index or a range"),
        ("0-", "'0-'", "is not an index or a range"),
        ("1.5", "'1.5'", "is not an index or a range"),
        ("0 1", "'0 1'", "is not an index or a range"),
        ("3-0", "'3-0'", "reversed range; write it as 0-3"),
        ("0,1,1", "GPU 1", "given twice"),
        ("0-3,2", "GPU 2", "given twice"),
        (f"0-{MAX_GPU_INDEX + 1}", f"'0-{MAX_GPU_INDEX + 1}'", f"above {MAX_GPU_INDEX}"),
        ("0-" + "9" * 5000, "GPU index 9999999999", f"above {MAX_GPU_INDEX}"),  # no int() of 5000 digits
        ("0" * 30 + "3-1", "swap the bounds", "reversed range"),
    ],
)
def test_parse_gpu_list_errors_name_the_flag_and_item(value: str, offending: str | None, problem: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_gpu_list(value)
    message = str(info.value)
    assert message.startswith("--gpus: ")
    assert problem in message
    if offending is not None:
        assert offending in message


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], {}),
        (["NCCL_DEBUG=INFO"], {"NCCL_DEBUG": "INFO"}),
        (["A=1", "_B=2", "c3=x"], {"A": "1", "_B": "2", "c3": "x"}),
        (["OPTS=--a=b --c=d"], {"OPTS": "--a=b --c=d"}),
        (["EMPTY="], {"EMPTY": ""}),
        (["SPACES= x "], {"SPACES": " x "}),
    ],
)
def test_parse_env_assignments(values: list[str], expected: dict[str, str]) -> None:
    assert parse_env_assignments(values) == expected


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ("NCCL_DEBUG", "expected NAME=VALUE"),
        ("=INFO", "'' is not a valid variable name"),
        ("1X=2", "'1X' is not a valid variable name"),
        ("NCCL-DEBUG=INFO", "'NCCL-DEBUG' is not a valid variable name"),
        ("A B=1", "'A B' is not a valid variable name"),
        (" A=1", "' A' is not a valid variable name"),
        ("A=x\0y", "NUL character"),
    ],
)
def test_parse_env_assignments_errors_name_the_flag_and_item(item: str, problem: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_env_assignments(["OK=1", item])
    message = str(info.value)
    assert message.startswith(f"--env {item!r}: ")
    assert problem in message


def test_parse_env_assignments_rejects_a_variable_given_twice() -> None:
    with pytest.raises(UsageError, match=r"^--env 'A=2': A is already set to '1'; give each variable once"):
        parse_env_assignments(["A=1", "A=2"])
