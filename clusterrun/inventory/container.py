"""The inventory's ``container:`` section (in ``defaults`` and on each node): the image the job runs in.

A node's settings are its own ``container:`` over ``defaults.container``, key by key (a node may add mounts or
use another image); ``image`` must be set by one of them. Like the rest of the inventory, unknown keys are errors.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from clusterrun.inventory.kinds import Runtime
from clusterrun.inventory.types import Text, _check_text


class Pull(str, enum.Enum):
    missing = "missing"  # pull when the node does not have the image
    always = "always"  # pull before every run (a tag that moves)
    never = "never"  # the image must be on the node: refused at once otherwise


def _check_mount(value: str) -> str:
    value = _check_text(value)
    parts = value.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError(f"expected SRC:DST or SRC:DST:ro, got {value!r}")
    if len(parts) == 3 and parts[2] not in ("ro", "rw"):
        raise ValueError(f"a mount's third part is 'ro' or 'rw', got {parts[2]!r} in {value!r}")
    src, dst = parts[0], parts[1]
    if not (src.startswith("/") or src.startswith("~/")):
        raise ValueError(f"a mount's source is an absolute path on the node (or ~/...), got {src!r}")
    if not dst.startswith("/"):
        raise ValueError(f"a mount's destination is an absolute path in the container, got {dst!r}")
    return value


def _check_image(value: str) -> str:
    value = _check_text(value).strip()
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"expected an image reference without spaces (e.g. nvcr.io/nvidia/pytorch:24.05-py3), "
                         f"got {value!r}")
    return value


Mount = Annotated[str, AfterValidator(_check_mount)]
Image = Annotated[str, AfterValidator(_check_image)]


class ContainerSettings(BaseModel):
    """How the job runs inside an image on a node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: Image | None = Field(default=None, description="the image, e.g. nvcr.io/nvidia/pytorch:24.05-py3")
    runtime: Runtime | None = Field(default=None, description="docker (default), podman or apptainer")
    mounts: list[Mount] | None = Field(default=None, description="SRC:DST[:ro] bind mounts, beside the run directory "
                                                                 "and workdir (always mounted at their own paths)")
    options: list[Text] | None = Field(default=None, description="extra arguments of the runtime's run command, "
                                                                 "placed last so that they win over clusterrun's")
    pull: Pull | None = Field(default=None, description="missing (default): pull when absent; always; never")
    shm_size: Annotated[str, Field(pattern=r"^[0-9]+[bkmgBKMG]?$")] | None = Field(
        default=None, description="a private IPC namespace with this /dev/shm size (e.g. 16g) instead of the "
                                  "host's IPC namespace")

    def merged_over(self, base: ContainerSettings | None) -> ContainerSettings:
        """Values set here win over ``base``."""
        data = base.model_dump(exclude_none=True) if base is not None else {}
        data.update(self.model_dump(exclude_none=True))
        return ContainerSettings(**data)

    @property
    def runtime_or_default(self) -> Runtime:
        return self.runtime or Runtime.docker

    @property
    def pull_or_default(self) -> Pull:
        return self.pull or Pull.missing


def container_problems(nodes: list[ContainerSettings | None],
                       defaults: ContainerSettings | None) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """``(path, message)`` for each node whose merged settings lack an image (``nodes``: each node's own
    ``container``; the defaults' lack is said once)."""
    said_defaults = False
    for index, settings in enumerate(nodes):
        merged = settings.merged_over(defaults) if settings is not None else defaults
        if merged is None or merged.image:
            continue
        if settings is None and said_defaults:
            continue
        said_defaults = said_defaults or settings is None
        where = ("nodes", index, "container") if settings is not None else ("defaults", "container")
        yield where, "container settings without an image: set container.image (e.g. nvcr.io/nvidia/pytorch:24.05-py3)"
