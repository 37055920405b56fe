"""Reading the node agent's answers with their specs (clusterrun/remote/answers.py): :func:`decode` turns one
received event into its typed answer, or raises :class:`AnswerError` naming the node, the kind and the field.

Each kind's spec is taken from its ``NamedTuple`` once, at import; reading an answer then costs a dictionary look-up
and a type test per field (about 2 microseconds for an ``out`` event). Standard library only (the cluster supervisor
takes it, remote/bundle.py).
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from clusterrun.remote import answers
from clusterrun.remote.answers import KINDS, Unknown

_MISSING = object()


class AnswerError(ValueError):
    """An answer that does not fit its kind's spec: ``node`` said ``kind`` with ``field`` missing or wrong."""

    def __init__(self, node: str, kind: str, field: str, problem: str) -> None:
        self.node, self.kind, self.field = node, kind, field
        self.reason = (f"the node agent's {kind!r} event {problem} (clusterrun cannot read it: a bug in the agent "
                       "or a corrupted stream; please report it with this message)")
        super().__init__(f"{node}: {self.reason}")


# A field's spec: (name, the exact types it accepts or None for any, its default or _MISSING, the answer type of its
# value or None, the answer type of each of its values (a dict of them) or None).
_Field = tuple[str, "frozenset[type] | None", Any, "type | None", "type | None"]
_SPECS: dict[type, tuple[_Field, ...]] = {}
_NAMES = {int: "int", float: "float", str: "str", bool: "bool", dict: "object", list: "list", type(None): "null"}


def _accepted(hint: Any) -> tuple[frozenset[type] | None, type | None, type | None]:
    if hint is Any:
        return None, None, None
    exact: set[type] = set()
    nested = each = None
    for part in typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) else (hint,):
        origin = typing.get_origin(part) or part
        if part is type(None) or part is None:
            exact.add(type(None))
        elif isinstance(origin, type) and issubclass(origin, tuple) and hasattr(origin, "_fields"):
            exact.add(dict)
            nested = origin
        else:
            exact.add(origin)
            args = typing.get_args(part)
            if origin is dict and len(args) == 2 and hasattr(args[1], "_fields"):
                each = args[1]
            if origin is float:
                exact.add(int)  # JSON writes 3.0 as 3
    return frozenset(exact), nested, each


_UnionType = type(int | None)


def _spec(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    defaults = cls._field_defaults  # type: ignore[attr-defined]
    fields = []
    for name in cls._fields:  # type: ignore[attr-defined]
        exact, nested, each = _accepted(hints[name])
        fields.append((name, exact, defaults.get(name, _MISSING), nested, each))
    return tuple(fields)


def _build(node: str, kind: str, cls: type, event: dict[str, Any], where: str = "") -> Any:
    values = []
    for name, exact, default, nested, each in _SPECS[cls]:
        value = event.get(name, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise AnswerError(node, kind, where + name, f"lacks {where + name!r}")
            values.append(default.copy() if type(default) in (dict, list) else default)
            continue
        if exact is not None and type(value) not in exact:
            wanted = " or ".join(sorted(_NAMES.get(t, t.__name__) for t in exact if t is not int or float not in exact))
            raise AnswerError(node, kind, where + name, f"has {where + name!r} {_shown(value)}, not {wanted}")
        if nested is not None and value is not None:
            value = _build(node, kind, nested, value, f"{where}{name}.")
        elif each is not None and value is not None:
            value = {key: _fit_each(node, kind, each, item, f"{where}{name}.{key}") for key, item in value.items()}
        values.append(value)
    return tuple.__new__(cls, values)


def _shown(value: Any) -> str:
    return "null" if value is None else f"{_NAMES.get(type(value), type(value).__name__)} {value!r:.60}"


def _fit_each(node: str, kind: str, cls: type, item: Any, where: str) -> Any:
    if type(item) is not dict:
        raise AnswerError(node, kind, where, f"has {where!r} {_shown(item)}, not object")
    return _build(node, kind, cls, item, where + ".")


def _reader(kind: str, cls: type) -> Callable[[dict[str, Any], str], Any]:
    """The reader of kind ``cls``: :func:`_build`, or for a kind of flat fields (``out``, ``sample``: the events
    that come by the thousand) the same checks written out as one function, which hands an answer that does not
    fit to :func:`_build` to name what is wrong."""
    spec = _SPECS[cls]
    if any(nested or each or type(default) in (dict, list) or (
            default is not _MISSING and exact is not None and type(default) not in exact)
           for _, exact, default, nested, each in spec):
        return lambda event, node: _build(node, kind, cls, event)
    scope: dict[str, Any] = {"M": _MISSING, "new": tuple.__new__, "cls": cls, "kind": kind, "slow": _build}
    lines, checks = ["def read(event, node):", " get = event.get"], []
    for i, (name, exact, default, _, _) in enumerate(spec):
        scope[f"D{i}"], scope[f"E{i}"] = default, exact
        lines.append(f" v{i} = get({name!r}, D{i})")
        checks.append(f"v{i} is M" if exact is None else f"type(v{i}) not in E{i}")
    if checks:
        lines += [f" if {' or '.join(checks)}:", "  return slow(node, kind, cls, event)"]
    lines.append(f" return new(cls, ({''.join(f'v{i}, ' for i in range(len(spec)))}))")
    exec("\n".join(lines), scope)  # text made here from the specs above, nothing received
    return scope["read"]


def decode(event: dict[str, Any], node: str) -> Any:
    """The answer ``event`` (one received JSON object with ``ev``) from ``node`` is, typed. Raises
    :class:`AnswerError` naming the node and the field when it does not fit its kind's spec."""
    kind = event.get("ev")
    if type(kind) is not str:
        raise AnswerError(node, str(kind)[:40], "ev", f"has 'ev' {_shown(kind)}, not str")
    read = _READERS.get(kind)
    return read(event, node) if read is not None else Unknown(kind, dict(event))


for _cls in vars(answers).values():
    if isinstance(_cls, type) and issubclass(_cls, tuple) and hasattr(_cls, "_fields"):
        _SPECS[_cls] = _spec(_cls)
_READERS = {kind: _reader(kind, cls) for kind, cls in KINDS.items()}
