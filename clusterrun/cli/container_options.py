"""``--image`` and ``--container-runtime``: the inventory's container settings, as the command line changes them."""

from __future__ import annotations

from typing import Any


def with_container(inv: Any, image: str | None, runtime: str | None) -> Any:
    """``inv`` with ``defaults.container`` set from the flags (they win over the file; a node's own
    ``container:`` keys still win over the defaults, except the image and runtime the flags name). Raises
    :class:`clusterrun.errors.UsageError` for a value the inventory would refuse."""
    from pydantic import ValidationError

    from clusterrun.errors import UsageError
    from clusterrun.inventory.models import Inventory

    flags = {key: value for key, value in (("image", image), ("runtime", runtime)) if value}
    data = inv.model_dump(mode="json", exclude_none=True)
    data["defaults"]["container"] = {**data["defaults"].get("container", {}), **flags}
    for node in data["nodes"]:
        if "container" in node:
            node["container"].update(flags)
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:
        said = exc.errors()[0]["msg"]
        named = " and ".join(f for f, v in (("--image", image), ("--container-runtime", runtime)) if v)
        if "without an image" in said:
            said = "a container needs an image: give --image IMAGE too, or set container.image in the inventory"
        raise UsageError(f"{named}: {said}") from None
