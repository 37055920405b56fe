"""Load an inventory from YAML, with every error pointing at ``file:line:col``.

PyYAML silently keeps the last of two equal keys and forgets where values came
from, so the document is composed into YAML nodes and walked here: duplicate keys
are errors, and every value's position is kept by its path (``nodes[1].nics[0]``)
so that pydantic's errors and the cross-field rules can be shown at their line.

A file may be hostile or simply the wrong one, so loading is bounded: the file's size
(:data:`~clusterrun.inventory.textfile.MAX_FILE_BYTES`), how deep values nest
(:data:`MAX_DEPTH`), how many values the document holds once every alias is expanded
(:data:`MAX_VALUES`, which stops a "billion laughs" document before it expands), an
alias inside the value it names, and numbers longer than :data:`MAX_NUMBER_CHARS`
(Python would spend minutes on some of them). Each gives one error at its ``file:line``.
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path as FsPath
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from clusterrun.errors import InventoryError
from clusterrun.inventory.models import Inventory, Path
from clusterrun.inventory.textfile import MAX_FILE_BYTES, MAX_FILE_LABEL, read_text_file
from clusterrun.inventory.types import brief_repr, format_path

Position = tuple[int, int]  # 1-based line, column

#: Deepest nesting of lists and mappings, aliases expanded; an inventory needs 6.
MAX_DEPTH = 32
#: Most values (keys included) a document may hold, aliases expanded: about 6000 fully written nodes.
MAX_VALUES = 250_000
#: Longest number read; no inventory setting needs more than a few digits.
MAX_NUMBER_CHARS = 100
#: Most problems spelled out in one error; the rest are counted.
MAX_PROBLEMS_SHOWN = 20


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that clusterrun will not load (too deep, too large, a recursive alias)."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, composing under the bounds of this module.

    Aliases are not copies: the composer hands back the anchored node itself. The expanded
    size and height of every finished node are kept, so an alias is checked against the
    bounds in constant time, and an alias to a node still being composed (a cycle) is refused.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._composed = 0
        self._size: dict[int, int] = {}  # id(node) -> values in it, aliases expanded
        self._height: dict[int, int] = {}  # id(node) -> nesting levels in it, aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined alias is left to PyYAML's own message
                if id(target) not in self._size:
                    raise _Refused(None, None, f"alias *{event.anchor} is used inside the value it names, which "
                                   "would repeat it forever; an alias may only repeat a value that ends before it",
                                   event.start_mark)
                if self._depth + self._height[id(target)] > MAX_DEPTH:
                    raise _Refused(None, None, f"alias *{event.anchor} nests values deeper than {MAX_DEPTH} levels; "
                                   "an inventory needs far fewer", event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        self._composed += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(None, None, f"values nest deeper than {MAX_DEPTH} levels; an inventory needs far fewer "
                           "(look for brackets that are never closed)", self.peek_event().start_mark)
        if self._composed > MAX_VALUES:
            raise _Refused(None, None, f"the document holds more than {MAX_VALUES} values; an inventory needs far "
                           "fewer", self.peek_event().start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        self._size[id(node)] = 1 + sum(self._size[id(c)] for c in children)
        self._height[id(node)] = 1 + max((self._height[id(c)] for c in children), default=0)
        if self._size[id(node)] > MAX_VALUES:
            raise _Refused(None, None, f"with its aliases expanded, this value holds more than {MAX_VALUES} values "
                           "(an alias repeated inside values that are themselves repeated); an inventory needs far "
                           "fewer", node.start_mark)
        return node


class _BoundedConstructor(yaml.constructor.SafeConstructor):
    """PyYAML's safe constructor, refusing numbers too long to be any inventory setting, and
    explicit tags on values they cannot describe.

    Python refuses decimal integers over 4300 digits with a ValueError, and a sexagesimal
    number (``1:30:00``) of a million parts takes minutes to compute. PyYAML itself fails with
    a KeyError on ``!!bool maybe`` and an AttributeError on ``!!timestamp soon``.
    """

    def _short_number(self, node: yaml.ScalarNode) -> None:
        if len(node.value) > MAX_NUMBER_CHARS:
            raise _Refused(None, None, f"a number of {len(node.value)} characters is longer than any setting takes "
                           f"(at most {MAX_NUMBER_CHARS}); quote it if it is meant as text", node.start_mark)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        self._short_number(node)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        self._short_number(node)
        return super().construct_yaml_float(node)

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool:
        value = self.construct_scalar(node)
        if value.lower() not in self.bool_values:
            raise yaml.constructor.ConstructorError(
                None, None, f"{brief_repr(value)} is not a boolean; write true or false", node.start_mark)
        return super().construct_yaml_bool(node)

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> object:
        value = self.construct_scalar(node)
        if self.timestamp_regexp.match(value) is None:
            raise yaml.constructor.ConstructorError(
                None, None, f"{brief_repr(value)} is not a date; quote it if it is meant as text", node.start_mark)
        return super().construct_yaml_timestamp(node)


for _tag, _method in (("int", _BoundedConstructor.construct_yaml_int),
                      ("float", _BoundedConstructor.construct_yaml_float),
                      ("bool", _BoundedConstructor.construct_yaml_bool),
                      ("timestamp", _BoundedConstructor.construct_yaml_timestamp)):
    _BoundedConstructor.add_constructor(f"tag:yaml.org,2002:{_tag}", _method)


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


def _construct(ctor: yaml.constructor.SafeConstructor, node: yaml.Node) -> Any:
    try:
        return ctor.construct_object(node, deep=True)
    except (ValueError, OverflowError) as exc:  # a date like 2024-13-45, which the resolver took for one
        what = brief_repr(node.value) if isinstance(node, yaml.ScalarNode) else "this value"
        raise yaml.constructor.ConstructorError(
            None, None, f"cannot read {what}: {exc}; quote it if it is meant as text", node.start_mark) from None


def _walk(node: yaml.Node, path: Path, pos: _Positions, ctor: yaml.constructor.SafeConstructor,
          source: str, problems: list[str]) -> Any:
    pos.values[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        ctor.flatten_mapping(node)  # resolve `<<: *anchor` merge keys first
        result: dict[Any, Any] = {}
        first_seen: dict[Any, Position] = {}
        for key_node, value_node in node.value:
            key = _construct(ctor, key_node)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                line, col = _mark(key_node)
                problems.append(f"{source}:{line}:{col}: {format_path(path)}: a mapping key must be a plain value")
                continue
            if key in first_seen:
                line, col = _mark(key_node)
                problems.append(
                    f"{source}:{line}:{col}: {format_path((*path, str(key)))}: duplicate key {brief_repr(key)} "
                    f"(first at line {first_seen[key][0]}); YAML would silently keep only the last one"
                )
                continue
            first_seen[key] = _mark(key_node)
            pos.keys[(*path, key)] = _mark(key_node)
            result[key] = _walk(value_node, (*path, key), pos, ctor, source, problems)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*path, i), pos, ctor, source, problems) for i, item in enumerate(node.value)]
    return _construct(ctor, node)


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
                         "greater_than_equal", "less_than_equal", "greater_than", "less_than", "enum",
                         "finite_number"}:
        msg = f"{msg[0].lower()}{msg[1:]}, got {brief_repr(error.get('input'))}"
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
            out.append(f"{source}:{line}:{col}: {format_path(loc)}: unknown key {brief_repr(key)}{hint}")
            continue
        if error["type"] == "missing":
            line, col = pos.of_value(loc[:-1]) or (1, 1)
            out.append(f"{source}:{line}:{col}: {format_path(loc)}: required key {loc[-1]!r} is missing")
            continue
        line, col = pos.of_value(loc) or (1, 1)
        out.append(f"{source}:{line}:{col}: {format_path(loc)}: {_describe(error)}")
    return out


def _fail(source: str, problems: list[str]) -> InventoryError:
    if len(problems) == 1:
        return InventoryError(problems[0], tuple(problems))
    shown = problems[:MAX_PROBLEMS_SHOWN]
    if len(problems) > len(shown):
        shown.append(f"... and {len(problems) - len(shown)} more; fix these first")
    return InventoryError(f"{source}: {len(problems)} problems\n  " + "\n  ".join(shown), tuple(problems))


def parse_inventory_text(text: str, source: str = "<inventory>") -> Inventory:
    """Parse and validate inventory YAML.

    Returns the validated :class:`Inventory`.
    Raises :class:`InventoryError` listing every problem as ``source:line:col: path: message``,
    or the one place where the text is not YAML or breaks a bound of this module.
    """
    if len(text) > MAX_FILE_BYTES:
        raise _fail(source, [f"{source}: is {len(text)} characters, more than the {MAX_FILE_LABEL} clusterrun reads "
                             "from an inventory; check that this is the right file"])
    try:
        loader = _BoundedLoader(text)
        try:
            document = loader.get_single_node()
        finally:
            loader.dispose()
    except _Refused as exc:
        raise _fail(source, [f"{_where(source, exc.problem_mark)}: {exc.problem}"]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "cannot be parsed"
        raise _fail(source, [f"{_where(source, mark)}: invalid YAML: {what}"]) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise _fail(source, [f"{source}:{line}:{col}: invalid YAML: the control character {chr(exc.character)!r} "
                             "is not allowed in YAML; remove it (in a double-quoted string, write it as an "
                             "escape such as \\t)"]) from None
    except yaml.YAMLError as exc:
        raise _fail(source, [f"{source}: invalid YAML: {brief_repr(str(exc))}"]) from None
    if document is None:
        raise _fail(source, [f"{source}:1:1: the inventory is empty: it needs at least a 'nodes:' list"])
    if not isinstance(document, yaml.MappingNode):
        line, col = _mark(document)
        raise _fail(source, [f"{source}:{line}:{col}: expected a mapping with 'nodes:' at the top level"])
    pos = _Positions()
    problems: list[str] = []
    ctor = _BoundedConstructor()
    try:
        data = _walk(document, (), pos, ctor, source, problems)
    except _Refused as exc:
        raise _fail(source, [f"{_where(source, exc.problem_mark)}: {exc.problem}"]) from None
    except yaml.constructor.ConstructorError as exc:
        raise _fail(source, [f"{_where(source, exc.problem_mark)}: invalid YAML: {exc.problem}"]) from None
    if problems:
        raise _fail(source, problems)
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:
        raise _fail(source, _problems_from(exc, pos, source)) from None


def _where(source: str, mark: yaml.Mark | None) -> str:
    return f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source


def load_inventory(path: str | FsPath) -> Inventory:
    """Read and validate an inventory file.

    Returns the validated :class:`Inventory`.
    Raises :class:`InventoryError` naming the file: see :func:`read_text_file` for what is
    refused before reading (special files, over 4 MiB, not UTF-8), and :func:`parse_inventory_text`.
    """
    text = read_text_file(path, "inventory", "no such inventory file (the inventories/ folder of clusterrun has "
                                             "commented examples)")
    return parse_inventory_text(text, str(path))
