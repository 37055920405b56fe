"""The command that starts the node agent for one node of a plan."""

from __future__ import annotations

import base64
import json
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from clusterrun.plan import NodePlan

AGENT_PATH = Path(__file__).with_name("node_agent.py")


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


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@lru_cache(maxsize=1)
def _inline_source() -> str:
    # The agent travels inside the command line (compressed), so starting a node costs
    # one round trip and nothing has to be installed or copied first.
    return _b64(zlib.compress(AGENT_PATH.read_bytes(), 9))


def agent_argv(python: str, mode: str, args: list[str], *, inline: bool) -> list[str]:
    """``[python, <agent>, mode, *args]``; ``inline`` embeds the agent's source in the command."""
    if inline:
        loader = f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{_inline_source()}')))"
        return [python, "-c", loader, mode, *args]
    return [python, str(AGENT_PATH), mode, *args]


def run_argv(node: NodePlan, spec: dict[str, Any], *, inline: bool) -> list[str]:
    return agent_argv(node.python, "run", [_b64(json.dumps(spec).encode())], inline=inline)
