"""Where a value of a loaded inventory stands in its YAML file: ``cluster.yaml:14``.

The models keep no positions once validated; findings that blame the inventory (doctor's "the inventory
says 198.19.0.99, the node has 198.19.0.12") point at the line to fix, so this reads the file again and
walks its YAML nodes. Pure apart from reading the file; any problem (file gone, changed, not YAML) gives
None and the caller says "the inventory" instead of a line.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from clusterrun.inventory.textfile import MAX_FILE_BYTES


def nic_line(path: str | Path, node: str, nic: str, key: str) -> str | None:
    """``file:line`` of ``key`` (``ip``, ``name``) of the NIC named ``nic`` of the node named ``node`` in the
    YAML inventory at ``path``; the NIC's own line when it has no such key; None when not found."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        if len(text) > MAX_FILE_BYTES:
            return None
        document = yaml.compose(text, Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    entry = _item_named(_value(document, "nodes"), node)
    item = _item_named(_value(entry, "nics"), nic)
    if item is None:
        return None
    at = _value(item, key) or item
    return f"{path}:{at.start_mark.line + 1}"


def _value(mapping: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(mapping, yaml.MappingNode):
        return None
    return next((v for k, v in mapping.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)


def _item_named(sequence: yaml.Node | None, name: str) -> yaml.Node | None:
    if not isinstance(sequence, yaml.SequenceNode):
        return None
    for item in sequence.value:
        found = _value(item, "name")
        if isinstance(found, yaml.ScalarNode) and found.value == name:
            return item
    return None
