"""``clusterrun up INVENTORY SCRIPT``: the nodes' sshd dialled first, before click, pydantic and paramiko load.

Only the plain case is read here, with the standard library, PyYAML and clusterrun's ssh_config reader: ``up``'s
options are skipped by name (:data:`VALUE_OPTIONS` take a value; a test holds the list equal to the command's),
the inventory file is read without validation, and each node reached over SSH directly (no jump host, no
ProxyCommand) is dialled as its transport will resolve it (:func:`clusterrun.transport.ssh.resolve.host_config`,
whose answer the transport reuses). Anything else (another command, ``--ips``/``--hostfile``/``--slurm``, a dry
run, an inventory this cannot read) dials nothing: the command connects as it always did, and reports every
problem itself, validated, with its file and line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

#: ``up``'s options that take a value (one token after them).
VALUE_OPTIONS = frozenset({
    "--container-runtime", "--cpu-bind", "--data-nic", "--env", "--env-forward", "--gpus", "--grace", "--hang-timeout",
    "--image", "--master-port", "--max-restarts", "--min-nodes", "--nodes", "--notify", "--nproc-per-node",
    "--on-hang", "--on-path-loss", "--preflight", "--python", "--rank-order", "--ranks", "--restart-backoff",
    "--runs-dir", "--sample-every", "--sync", "--timeout", "-e",
})
#: Options after which nothing is dialled here: other nodes, other SSH settings, or no launch at all.
OTHER_OPTIONS = frozenset({
    "--ips", "--hostfile", "--slurm", "--transport", "--ssh-config", "--ssh-user", "--wait-gpus", "--dry-run",
    "--json", "--help", "-h",
})


def inventory_of(argv: Sequence[str]) -> str | None:
    """The inventory file of ``up [OPTIONS] INVENTORY SCRIPT ...``, or None where it is not that plain case."""
    if len(argv) < 3 or argv[0] != "up":
        return None
    words = iter(argv[1:])
    for word in words:
        name = word.split("=", 1)[0]
        if name in OTHER_OPTIONS:
            return None
        if word == "--":
            word = next(words, "")
        elif word.startswith("-"):
            if name in VALUE_OPTIONS and "=" not in word:
                next(words, None)
            continue
        return word if word.endswith((".yaml", ".yml")) and os.path.isfile(word) else None
    return None


def _ssh_nodes(data: Any) -> list[tuple[str, Mapping[str, Any]]]:
    """(host, its SSH settings over the defaults') for each node the job runs on over SSH."""
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
        return []
    defaults = data.get("defaults") if isinstance(data.get("defaults"), Mapping) else {}
    base = defaults.get("ssh") if isinstance(defaults.get("ssh"), Mapping) else {}
    out = []
    for node in data["nodes"]:
        if not isinstance(node, Mapping) or node.get("spare") or not isinstance(node.get("host"), str):
            continue
        if (node.get("transport") or defaults.get("transport") or "ssh") != "ssh":
            continue
        own = node.get("ssh") if isinstance(node.get("ssh"), Mapping) else {}
        out.append((node["host"], {**base, **own}))
    return out


def _dial_node(host: str, settings: Mapping[str, Any]) -> None:
    from clusterrun.transport.ssh import dial
    from clusterrun.transport.ssh.config import config_files
    from clusterrun.transport.ssh.resolve import address_of, connect_timeout_of, host_config

    if settings.get("jump_host") or host in ("localhost", "127.0.0.1", "::1"):
        return
    config = settings.get("config_file")
    user, port, timeout = settings.get("user"), settings.get("port"), settings.get("connect_timeout")
    port = port if isinstance(port, int) else None
    found = host_config(host, config, config_files(config), user=user if isinstance(user, str) else None, port=port)
    if found.proxy is not None and found.proxy.value is not None and found.proxy.value.lower() != "none":
        return
    hostname, port = address_of(host, found, port)
    given = float(timeout) if isinstance(timeout, (int, float)) and 0 < timeout <= 600 else None
    dial.dial(hostname, port, connect_timeout_of(found, given))


def dial_nodes(argv: Sequence[str]) -> int:
    """Dial the nodes of ``clusterrun up``'s inventory, where ``argv`` is the plain case; how many were.
    Never raises: whatever this cannot do, the command does as before."""
    try:
        path = inventory_of(argv)
        if path is None:
            return 0
        import yaml

        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        nodes = _ssh_nodes(data)
        if len(nodes) < 2:  # one node: nothing to win, and its host may be this machine
            return 0
        import threading

        from clusterrun.transport.ssh.dial import MAX_DIALS

        for host, settings in nodes[:MAX_DIALS]:  # ssh_config is read by `ssh -G`: a process per host, at once
            threading.Thread(target=_dial_quietly, args=(host, settings), daemon=True, name=f"resolve-{host}").start()
        return len(nodes)
    except Exception:  # a shortcut only: the command reports every problem itself
        return 0


def _dial_quietly(host: str, settings: Mapping[str, Any]) -> None:
    try:
        _dial_node(host, settings)
    except Exception:  # the transport resolves the host again and reports what is wrong
        return
