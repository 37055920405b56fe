"""The inventory's ``run`` section: how ``up`` runs and watches a job (each setting has a flag that wins)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from clusterrun.inventory.types import MAX_NODES, MAX_TIMEOUT, _check_text


class _Model(BaseModel):
    """Every inventory model: frozen, and an unknown key is an error (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSettings(_Model):
    """How `up` runs and watches a job; a flag on the command line wins over each."""

    path_watch: bool = Field(default=True, description="the nodes check the job's data paths with UDP probes")
    on_path_loss: Literal["stop", "warn"] = Field(default="stop", description="what a dead data path does")
    hang_timeout: Annotated[float, Field(ge=1, le=MAX_TIMEOUT, allow_inf_nan=False)] | None = Field(
        default=None, description="seconds without output from any rank before every rank's stack is taken")
    on_hang: Literal["wait", "stop"] = Field(default="wait", description="after the stacks of a hang")
    notify: list[Annotated[str, Field(pattern=r"^https?://"), AfterValidator(_check_text)]] = Field(
        default_factory=list, description="webhook URLs told of the start, the first failure and the end")
    max_restarts: Annotated[int, Field(ge=0, le=100)] = Field(
        default=0, description="after a failure, start the job again up to this many times")
    min_nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] | None = Field(
        default=None, description="with restarts, leave a lost node out as long as this many nodes remain "
                                  "(default: every node is needed)")
    restart_backoff: Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)] = Field(
        default=5.0, description="seconds before the first restart, doubling for each further one (at most 60)")
    sample_every: Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)] = Field(
        default=1.0, description="seconds between the nodes' samples of NICs, ranks and GPUs (0: none)")
    fold: bool = Field(default=True, description="a line that many ranks print alike is shown once on the terminal, "
                                                 "under all their ranks (the rank logs hold every copy)")
    cpu_bind: Literal["numa", "none"] = Field(
        default="numa", description="numa: each rank runs on the CPUs and memory node of its GPU's NUMA node (where "
                                    "nvidia-smi topo -m says them); none: where the system puts it")
