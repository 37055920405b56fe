"""Load an inventory from YAML, with every error pointing at ``file:line:col``.

PyYAML silently keeps the last of two equal keys and forgets where values came
from, so the document is composed into YAML nodes and walked here: duplicate keys
are errors, and every value's position is kept by its path (``nodes[1].nics[0]``)
so that pydantic's errors and the cross-field rules can be shown at their line.
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path as FsPath
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from clusterrun.errors import InventoryError
from clusterrun.inventory.models import Inventory, Path, format_path

Position = tuple[int, int]  # 1-based line, column


class _Positions:
    """Where each value (and each mapping key) stands in the file."""

    def __init__(self) -> None:
        self.values: dict[Path, Position] = {}
        self.keys: dict[Path, Position] = {}

    def of_value(self, path: Path) -> Position | None:
        # Fall back to the nearest enclosing value that has a position.
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.values:
                return self.values[path[:cut]]
        return None

    def of_key(self, path: Path) -> Position | None:
        return self.keys.get(path) or self.of_value(path)


def _mark(node: yaml.Node) -> Position:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _walk(node: yaml.Node, path: Path, pos: _Positions, ctor: yaml.constructor.SafeConstructor,
          source: str, problems: list[str]) -> Any:
    pos.values[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        ctor.flatten_mapping(node)  # resolve `<<: *anchor` merge keys first
        result: dict[Any, Any] = {}
        first_seen: dict[Any, Position] = {}
        for key_node, value_node in node.value:
            key = ctor.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                line, col = _mark(key_node)
                problems.append(f"{source}:{line}:{col}: {format_path(path)}: a mapping key must be a plain value")
                continue
            if key in first_seen:
                line, col = _mark(key_node)
                problems.append(
                    f"{source}:{line}:{col}: {format_path((*path, str(key)))}: duplicate key {key!r} "
                    f"(first at line {first_seen[key][0]}); YAML would silently keep only the last one"
                )
                continue
            first_seen[key] = _mark(key_node)
            pos.keys[(*path, key)] = _mark(key_node)
            result[key] = _walk(value_node, (*path, key), pos, ctor, source, problems)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*path, i), pos, ctor, source, problems) for i, item in enumerate(node.value)]
    return ctor.construct_object(node, deep=True)


def _model_at(path: Path) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``path`` (for 'did you mean')."""
    model: Any = Inventory
    for part in path:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        model = _unwrap(model.model_fields[part].annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
        for inner in typing.get_args(arg):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return annotation


def _describe(error: dict[str, Any]) -> str:
    msg: str = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if error["type"] in {"int_type", "int_parsing", "string_type", "bool_type", "bool_parsing", "list_type",
                         "dict_type", "model_type", "float_type", "float_parsing", "literal_error",
                         "greater_than_equal", "less_than_equal", "greater_than", "less_than", "enum"}:
        msg = f"{msg[0].lower()}{msg[1:]}, got {error.get('input')!r}"
    return msg


def _problems_from(exc: ValidationError, pos: _Positions, source: str) -> list[str]:
    out: list[str] = []
    for error in exc.errors(include_url=False):
        loc: Path = tuple(p for p in error["loc"] if isinstance(p, int) or not str(p).startswith("function-"))
        if error["type"] == "inventory_rules":
            for rule_path, message in error["ctx"]["problems"]:
                line, col = pos.of_value(tuple(rule_path)) or (1, 1)
                out.append(f"{source}:{line}:{col}: {format_path(tuple(rule_path))}: {message}")
            continue
        if error["type"] == "extra_forbidden":
            key = loc[-1]
            line, col = pos.of_key(loc) or (1, 1)
            model = _model_at(loc[:-1])
            allowed = sorted(model.model_fields) if model else []
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else (
                f"; allowed keys here: {', '.join(allowed)}" if allowed else "")
            out.append(f"{source}:{line}:{col}: {format_path(loc)}: unknown key {key!r}{hint}")
            continue
        if error["type"] == "missing":
            line, col = pos.of_value(loc[:-1]) or (1, 1)
            out.append(f"{source}:{line}:{col}: {format_path(loc)}: required key {loc[-1]!r} is missing")
            continue
        line, col = pos.of_value(loc) or (1, 1)
        out.append(f"{source}:{line}:{col}: {format_path(loc)}: {_describe(error)}")
    return out


def _fail(source: str, problems: list[str]) -> InventoryError:
    head = problems[0] if len(problems) == 1 else f"{source}: {len(problems)} problems\n  " + "\n  ".join(problems)
    return InventoryError(head, tuple(problems))


def parse_inventory_text(text: str, source: str = "<inventory>") -> Inventory:
    """Parse and validate inventory YAML.

    Returns the validated :class:`Inventory`.
    Raises :class:`InventoryError` listing every problem as ``source:line:col: path: message``.
    """
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise _fail(source, [f"{where}: invalid YAML: {exc.problem or exc}"]) from None
    except yaml.YAMLError as exc:
        raise _fail(source, [f"{source}: invalid YAML: {exc}"]) from None
    if document is None:
        raise _fail(source, [f"{source}:1:1: the inventory is empty: it needs at least a 'nodes:' list"])
    if not isinstance(document, yaml.MappingNode):
        line, col = _mark(document)
        raise _fail(source, [f"{source}:{line}:{col}: expected a mapping with 'nodes:' at the top level"])
    pos = _Positions()
    problems: list[str] = []
    ctor = yaml.constructor.SafeConstructor()
    try:
        data = _walk(document, (), pos, ctor, source, problems)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise _fail(source, [f"{where}: invalid YAML: {exc.problem}"]) from None
    if problems:
        raise _fail(source, problems)
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:
        raise _fail(source, _problems_from(exc, pos, source)) from None


def load_inventory(path: str | FsPath) -> Inventory:
    """Read and validate an inventory file. Raises :class:`InventoryError`."""
    path = FsPath(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{path}: no such inventory file (the inventories/ folder of clusterrun has commented examples)") from None
    except IsADirectoryError:
        raise InventoryError(f"{path}: is a directory, expected an inventory YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: cannot read the inventory: {exc}") from None
    return parse_inventory_text(text, str(path))
