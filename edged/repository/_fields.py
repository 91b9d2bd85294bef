"""Typed readers for the fields of a text-format tree: each checks the value's type and range and raises a
ModelConfigError at the field's line and column naming the field, what was expected and what was found.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, NoReturn

from edged.errors import ModelConfigError
from edged.repository._pbtxt import Field, Ident, Message, format_scalar
from edged.repository._schema import ENUMS, FLOATS, INTEGERS, MESSAGES, element, field_type, map_types, unknown_field

INT32 = (-(2**31), 2**31 - 1)
UINT32 = (0, 2**32 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT64 = (0, 2**64 - 1)
_INT_STRING = re.compile(r"-?[0-9]+")
BOOL_IDENTS = {"true": True, "True": True, "t": True, "false": False, "False": False, "f": False}
_FLOAT_IDENTS = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}


def describe(value: Message | Ident | int | float | str) -> str:
    if isinstance(value, Message):
        return "a message"
    if isinstance(value, Ident):
        return f"identifier {value.name}"
    if isinstance(value, str):
        return f"string {format_scalar(value)}"
    return f"{type(value).__name__} {format_scalar(value)}"


@dataclass
class Reader:
    """Reads one config file; collects the fields edged does not model (kept in ``extra``)."""

    path: str | None
    extra: dict[str, Any] = field(default_factory=dict)
    # protobuf's JSON form writes int64 and uint64 as strings ("dims": ["64"]) and its parser takes either form
    # for every integer field: a tree read from JSON accepts a string of decimal digits where an integer goes
    int_strings: bool = False

    def error(self, message: str, node: Field | Message) -> ModelConfigError:
        return ModelConfigError(message, self.path, node.line or None, node.column or None)

    def group(self, message: Message, where: str, known: frozenset[str], repeated: frozenset[str] = frozenset(), *,
              of: str | None) -> dict[str, list[Field]]:
        """Fields of a message of type ``of`` (None: a map entry, key and value) by name; fields of the schema
        outside ``known`` go to ``extra`` under their dotted path, typed by the schema; any other is refused."""
        groups: dict[str, list[Field]] = {}
        for item in message.fields:
            groups.setdefault(item.name, []).append(item)
        for name, items in list(groups.items()):
            if name in known:
                if name not in repeated and len(items) > 1:
                    raise self.error(f"field '{where}{name}' is not repeated but is given {len(items)} times",
                                     items[1])
                continue
            kind = field_type(of, name)
            if kind is None:
                self.refuse_unknown(of, where, items[0])
            self.extra[where + name] = self.kept(items, kind, where)
            del groups[name]
        return groups

    def refuse_unknown(self, of: str | None, where: str, item: Field) -> NoReturn:
        why = unknown_field(of, item.name) if of is not None else "a map entry has only a key and a value"
        raise self.error(f"field '{where}{item.name}' is unknown: {why}", item)

    def kept(self, items: list[Field], kind: str, where: str) -> Any:
        """A field edged does not model, as plain JSON-ready data of its schema type (checked as protobuf does)."""
        name = items[0].name
        pair = map_types(kind)
        if pair is not None:
            return self.kept_map(items, pair, where)
        if not kind.startswith("*") and len(items) > 1:
            raise self.error(f"field '{where}{name}' is not repeated but is given {len(items)} times", items[1])
        values = [self.kept_value(item, element(kind), where) for item in items]
        return values if kind.startswith("*") else values[0]

    def kept_map(self, items: list[Field], pair: tuple[str, str], where: str) -> dict[str, Any]:
        key_type, value_type = pair
        out: dict[str, Any] = {}
        for entry, key, value in self.map_entries(items, where):
            inner = f"{where}{entry.name}."
            name = "" if key is None else str(self.kept_value(key, key_type, inner))
            if value is None:
                out[name] = {} if value_type in MESSAGES else self.kept_default(value_type)
            else:
                out[name] = self.kept_value(value, value_type, inner)
        return out

    @staticmethod
    def kept_default(kind: str) -> Any:
        if kind == "bool":
            return False
        if kind in INTEGERS:
            return 0
        if kind in FLOATS:
            return 0.0
        return ENUMS[kind][0] if kind in ENUMS else ""

    def kept_value(self, item: Field, kind: str, where: str) -> Any:
        if kind in MESSAGES:
            body = self.message(item, where)
            inner = f"{where}{item.name}."
            fields: dict[str, list[Field]] = {}
            for sub in body.fields:
                fields.setdefault(sub.name, []).append(sub)
            out: dict[str, Any] = {}
            for name, subs in fields.items():
                sub_kind = field_type(kind, name)
                if sub_kind is None:
                    self.refuse_unknown(kind, inner, subs[0])
                out[name] = self.kept(subs, sub_kind, inner)
            return out
        if kind in ENUMS:
            return self.enum(item, where, ENUMS[kind])
        if kind == "bool":
            return self.boolean(item, where)
        if kind in INTEGERS:
            return self.integer(item, where, INTEGERS[kind])
        if kind in FLOATS:
            return self.floating(item, where)
        return self.string(item, where)

    def floating(self, item: Field, where: str) -> float:
        value = item.value
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, Ident) and value.name.lower() in _FLOAT_IDENTS:
            return _FLOAT_IDENTS[value.name.lower()]
        raise self.error(f"field '{where}{item.name}' expects a number, found {describe(value)}", item)

    def integer(self, item: Field, where: str, bounds: tuple[int, int]) -> int:
        value = item.value
        if self.int_strings and isinstance(value, str) and _INT_STRING.fullmatch(value):
            if len(value.lstrip("-")) > len(str(UINT64[1])):  # far out of range: int() would refuse past 4300
                raise self.error(f"field '{where}{item.name}' must be in [{bounds[0]}, {bounds[1]}], found a "
                                 f"{len(value)}-character number", item)
            value = int(value)
        if not isinstance(value, int):
            raise self.error(f"field '{where}{item.name}' expects an integer, found {describe(value)}", item)
        low, high = bounds
        if not low <= value <= high:
            raise self.error(f"field '{where}{item.name}' must be in [{low}, {high}], found {value}", item)
        return value

    def boolean(self, item: Field, where: str) -> bool:
        value = item.value
        if isinstance(value, Ident) and value.name in BOOL_IDENTS:
            return BOOL_IDENTS[value.name]
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise self.error(f"field '{where}{item.name}' expects true or false, found {describe(value)}", item)

    def string(self, item: Field, where: str) -> str:
        if not isinstance(item.value, str):
            raise self.error(f"field '{where}{item.name}' expects a quoted string, found "
                             f"{describe(item.value)}", item)
        return item.value

    def enum(self, item: Field, where: str, allowed: tuple[str, ...]) -> str:
        value = item.value
        if isinstance(value, Ident) and value.name in allowed:
            return value.name
        if isinstance(value, int) and 0 <= value < len(allowed):
            return allowed[value]  # protobuf text format also accepts an enum's number
        shown = [name for name in allowed if name != "TYPE_INVALID"]  # a placeholder, never a valid choice
        raise self.error(f"field '{where}{item.name}' expects one of {', '.join(shown)}; found "
                         f"{describe(value)}", item)

    def message(self, item: Field, where: str) -> Message:
        if not isinstance(item.value, Message):
            raise self.error(f"field '{where}{item.name}' expects a message {{ ... }}, found "
                             f"{describe(item.value)}", item)
        return item.value

    def map_entries(self, items: list[Field], where: str) -> list[tuple[Field, Field | None, Field | None]]:
        """Entries of a map field: (entry, key field, value field); a missing key or value is the default."""
        out: list[tuple[Field, Field | None, Field | None]] = []
        for item in items:
            entry = self.message(item, where)
            groups = self.group(entry, f"{where}{item.name}.", frozenset({"key", "value"}), of=None)
            key = groups.get("key", [None])[0]
            value = groups.get("value", [None])[0]
            out.append((item, key, value))
        return out

    def ints(self, items: list[Field] | None, where: str, bounds: tuple[int, int]) -> tuple[int, ...]:
        return tuple(self.integer(item, where, bounds) for item in items or [])


def one(groups: dict[str, list[Field]], name: str) -> Field | None:
    items = groups.get(name)
    return items[0] if items else None
