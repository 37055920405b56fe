"""The command that starts the node agent for one node of a plan (the agent itself: :mod:`clusterrun.remote.agent`)."""

from __future__ import annotations

import base64
import json
from typing import Any

from clusterrun import remote
from clusterrun.plan import NodePlan


def agent_spec(node: NodePlan, run_id: str, *, grace: float, heartbeat_timeout: float,
               stage: list[tuple[str, str]] | None = None, detached: bool = False) -> dict[str, Any]:
    return {
        "detached": detached,
        "stage": [list(pair) for pair in stage or ()],
        "run_id": run_id,
        "node": node.name,
        "rank_offset": node.rank_offset,
        "argv": list(node.argv),
        "env": node.env_dict(),
        "cwd": node.cwd,
        "run_dir": node.run_dir,
        "grace": grace,
        "heartbeat_timeout": heartbeat_timeout,
    }


def encode_spec(spec: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(spec).encode()).decode("ascii")


def run_argv(node: NodePlan, spec: dict[str, Any], *, inline: bool) -> list[str]:
    # Inline, the agent travels in the command line (compressed): starting a node costs one round trip, and
    # nothing has to be installed or copied first.
    return remote.argv(node.python, "agent", "run", encode_spec(spec), inline=inline)
