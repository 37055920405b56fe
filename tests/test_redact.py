"""Secrets in a job's environment are never printed or stored in clear."""

from __future__ import annotations

import pytest

from clusterrun import redact


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GITHUB_TOKEN",
                                  "MY_APIKEY", "hf_token", "SLACK_WEBHOOK", "SENTRY_DSN", "PGPASSWORD_X", "AUTH"])
def test_secret_names(name: str) -> None:
    assert redact.is_secret(name)


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "NCCL_IB_PKEY", "MASTER_ADDR", "KEYBOARD", "MONKEY", "PWD",
                                  "SSH_AUTH_SOCK", "PASSTHROUGH", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS"])
def test_plain_names(name: str) -> None:
    assert not redact.is_secret(name)


def test_values_are_masked_with_their_length_only() -> None:
    assert redact.env({"HF_TOKEN": "hf_abc123", "NCCL_DEBUG": "INFO", "DB_PASSWORD": ""}) == {
        "HF_TOKEN": "*** (9 characters)", "NCCL_DEBUG": "INFO", "DB_PASSWORD": ""}


def test_every_env_of_a_dumped_inventory_is_masked() -> None:
    dumped = {"defaults": {"env": {"HF_TOKEN": "x1"}, "python": "p"},
              "nodes": [{"name": "a", "env": {"DB_PASSWORD": "pw", "A": "1"}}, {"name": "b"}]}
    assert redact.inventory_dump(dumped) == {
        "defaults": {"env": {"HF_TOKEN": "*** (2 characters)"}, "python": "p"},
        "nodes": [{"name": "a", "env": {"DB_PASSWORD": "*** (2 characters)", "A": "1"}}, {"name": "b"}]}
