"""The command that starts the node agent for one node of a plan (the agent itself: :mod:`clusterrun.remote.agent`)."""

from __future__ import annotations

import base64
import json
from typing import Any

from clusterrun import remote
from clusterrun.errors import ConnectError
from clusterrun.plan import NodePlan
from clusterrun.transport.base import Stream, Transport


def agent_spec(node: NodePlan, run_id: str, *, grace: float, heartbeat_timeout: float,
               stage: list[tuple[str, str]] | None = None, detached: bool = False,
               script_args: int = 0) -> dict[str, Any]:
    """What the node agent needs; ``script_args``: how many of the argv's last items are the script's own
    arguments (passed exactly as typed, never expanded)."""
    return {
        "detached": detached,
        "stage": [list(pair) for pair in stage or ()],
        "run_id": run_id,
        "node": node.name,
        "rank_offset": node.rank_offset,
        "argv": list(node.argv),
        "script_args": script_args,
        "env": node.env_dict(),
        "cwd": node.cwd,
        "run_dir": node.run_dir,
        "grace": grace,
        "heartbeat_timeout": heartbeat_timeout,
    }


def encode_spec(spec: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(spec).encode()).decode("ascii")


def run_argv(node: NodePlan, *, inline: bool) -> list[str]:
    """``agent.py run -``: the spec follows on stdin (:func:`start_agent`). Inline, the agent travels in the
    command line (compressed): starting a node costs one round trip, and nothing has to be installed first."""
    return remote.argv(node.python, "agent", "run", "-", inline=inline)


def start_agent(transport: Transport, node: NodePlan, spec: dict[str, Any]) -> Stream:
    """Start the node agent and hand it its spec on stdin, never on the command line: the spec holds the job's
    environment (-e, --env-forward, inventory env: tokens, passwords), and any user of a node can read every
    process's command line. Raises :class:`ConnectError` when the spec cannot be sent."""
    stream = transport.start(run_argv(node, inline=not transport.is_local))
    if not stream.send(encode_spec(spec) + "\n"):
        stream.abort()
        raise ConnectError(node.name, "the node agent started but its connection closed before it got its spec")
    return stream
