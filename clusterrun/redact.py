"""Which environment values are secrets, and how they are shown and stored: never in clear.

A job's environment (``-e``, ``--env-forward``, an inventory's ``env``) often carries tokens and passwords:
``HF_TOKEN``, ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``. They reach the nodes (over the agent's
stdin, never a command line), but clusterrun writes them nowhere and prints them nowhere: ``plan``, ``up
--dry-run``, ``plan.json`` and ``inventory.json`` show such a value as ``***`` (with its length, so a wrong or
empty value can still be told apart). A variable is a secret when a word of its name says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***"
# Words of a variable's name (split at "_") that mark its value secret, and parts that do anywhere in it
# (PGPASSWORD, MYSECRET).
_SECRET_WORDS = re.compile(
    r"(^|_)(TOKEN|TOKENS|PASS|PWD|KEY|CREDS|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|DSN|WEBHOOK)(_|$)"
    r"|PASSWORD|PASSWD|PASSPHRASE|SECRET|CREDENTIAL|APIKEY", re.IGNORECASE)
# Names that contain such a word but hold no secret.
_NOT_SECRET = frozenset({"PWD", "OLDPWD", "SSH_AUTH_SOCK", "NCCL_IB_PKEY", "KEYTIMEOUT"})


def is_secret(name: str) -> bool:
    return name.upper() not in _NOT_SECRET and bool(_SECRET_WORDS.search(name))


def shown(name: str, value: str) -> str:
    """``value`` as it may be printed or stored: masked when ``name`` marks a secret."""
    if not is_secret(name) or value == "":
        return value
    return f"{MASK} ({len(value)} characters)"


def env(values: Mapping[str, str]) -> dict[str, str]:
    return {name: shown(name, value) for name, value in values.items()}


def inventory_dump(data: Any) -> Any:
    """A dumped inventory (``model_dump``) with every ``env`` mapping's secret values masked."""
    if isinstance(data, dict):
        return {key: env(value) if key == "env" and isinstance(value, dict) and all(isinstance(v, str) for v in
                                                                                     value.values())
                else inventory_dump(value) for key, value in data.items()}
    if isinstance(data, list):
        return [inventory_dump(item) for item in data]
    return data
