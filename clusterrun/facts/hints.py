"""What to check when a failed rank's log shows a known NCCL, Gloo or rendezvous failure."""

from __future__ import annotations

import re

from clusterrun.facts.parsers import nccl_log

# Gloo and torch's c10d store print their own messages; NCCL's are handled by the NCCL log parser.
_OTHER = (
    (re.compile(r"Connection refused", re.I),
     "a peer refused the connection: the master (rank 0) was not listening yet or had already died, or a "
     "firewall rejects the port; check MASTER_ADDR/--master-port and that rank 0 started"),
    (re.compile(r"No route to host|Network is unreachable", re.I),
     "no route between nodes on the data network: check the data subnet in the inventory and each node's "
     "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (clusterrun plan shows them)"),
    (re.compile(r"(timed out|Timeout|DistStoreError).*(store|rendezvous|connect|client)|"
                r"(store|rendezvous).*(timed out|timeout)", re.I),
     "the rendezvous timed out: a node never joined (did every node start? see its launcher.log), or traffic "
     "to the master port is dropped by a firewall"),
    (re.compile(r"Gloo connectFullMesh failed|gloo.*(Timed out|Connection reset)", re.I),
     "Gloo could not connect all ranks: the interface in GLOO_SOCKET_IFNAME may be up but unable to reach "
     "its peers (MTU, firewall, wrong subnet); check with `clusterrun plan` and ping across the data NIC"),
    (re.compile(r"Watchdog caught collective operation timeout", re.I),
     "a collective hung until the watchdog fired: one rank was slower or stuck (busy GPU, data loading) or "
     "the network dropped traffic; compare the other ranks' last lines"),
)


def failure_hints(lines: list[str], limit: int = 3) -> list[str]:
    """Up to ``limit`` distinct hints for the known failures in ``lines`` (most specific first)."""
    hints: list[str] = []
    try:
        parsed = nccl_log.parse("\n".join(lines))
        hints += [f.hint for f in parsed.failures if f.hint]
    except Exception:  # a log is not a contract: never let a hint break the summary
        pass
    text = "\n".join(lines)
    hints += [hint for pattern, hint in _OTHER if pattern.search(text)]
    unique = list(dict.fromkeys(hints))
    return unique[:limit]
