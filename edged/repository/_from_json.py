"""Reading Triton's JSON model-config back into a ModelConfig.

The JSON is turned into the same text-format tree the pbtxt parser makes (maps become key/value entries, enum
names become identifiers) and built by the same builder, so both inputs get the same type checks; integer fields
also take decimal strings, as protobuf's JSON form writes int64 and uint64 (its parser takes them for any integer
field, as Triton's JsonStringToMessage does), and field names in protobuf's lowerCamelCase JSON spelling
(``maxBatchSize``, MessageToJson's default) as well as the proto's own (map keys are data and stay as written).
Values that only normalization adds (runtime, batch_input, optimization defaults, ...) are accepted and kept.
"""

from __future__ import annotations

import re
from typing import Any

from edged.errors import ModelConfigError
from edged.repository._build import build_model_config
from edged.repository._pbtxt import Field, Ident, Message
from edged.repository._schema import ENUMS, FLOATS, INTEGERS, MESSAGES, element, field_type, map_types
from edged.repository.model_config import ModelConfig

_CAMEL_HUMP = re.compile(r"[A-Z]")
_NON_FINITE = frozenset({"Infinity", "-Infinity", "NaN"})
_DEFAULTS = {"runtime": "", "batch_input": [], "batch_output": [], "cc_model_filenames": {},
             "metric_tags": {}}


def model_config_from_json(data: dict[str, Any], path: str | None = None) -> ModelConfig:
    if not isinstance(data, dict):
        raise ModelConfigError(f"a model config in JSON must be an object, found {type(data).__name__}", path)
    cleaned = {_proto_name(str(key)): value for key, value in data.items()}
    cleaned = {key: value for key, value in cleaned.items() if _DEFAULTS.get(key, ...) != value}
    return build_model_config(_message(cleaned, "ModelConfig", path), path, int_strings=True)


def _message(data: dict[str, Any], of: str | None, path: str | None) -> Message:
    """A JSON object as a message of type ``of`` (None: not in the schema; the builder refuses its fields)."""
    fields: list[Field] = []
    for key, value in data.items():
        name = _proto_name(str(key))
        fields.extend(_fields(name, value, field_type(of, name), path))
    return Message(tuple(fields))


def _proto_name(name: str) -> str:
    """A field name as the proto spells it: protobuf's JSON name is its lowerCamelCase (``max_batch_size`` is
    ``maxBatchSize``); Triton's fields are lower case, so every capital starts a word."""
    return _CAMEL_HUMP.sub(lambda hump: "_" + hump.group().lower(), name)


def _fields(name: str, value: Any, kind: str | None, path: str | None) -> list[Field]:
    pair = None if kind is None else map_types(kind)
    if pair is not None and isinstance(value, dict):  # a map: one key/value entry per JSON member
        return [Field(name, _entry(name, key, item, pair, path)) for key, item in value.items()]
    one = None if kind is None else element(kind)
    if isinstance(value, list):
        return [Field(name, _value(name, item, one, path)) for item in value]
    return [Field(name, _value(name, value, one, path))]


def _entry(name: str, key: str, item: Any, pair: tuple[str, str], path: str | None) -> Message:
    key_type, value_type = pair
    key_value: int | str = key
    if key_type in INTEGERS:  # JSON object keys are strings; the builder checks the integer's range
        if not (key.isascii() and key.isdigit() and len(key) <= 20):  # '²' is a digit to isdigit, not to int()
            raise ModelConfigError(f"field '{name}' expects integer keys, found {key!r}", path)
        key_value = int(key)
    return Message((Field("key", key_value), Field("value", _value("value", item, value_type, path))))


def _value(name: str, value: Any, kind: str | None, path: str | None) -> Message | Ident | int | float | str:
    if isinstance(value, dict):
        return _message(value, kind if kind in MESSAGES else None, path)
    if isinstance(value, bool):
        return Ident("true" if value else "false")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        if kind in ENUMS:
            return Ident(value)
        if kind in FLOATS and value in _NON_FINITE:  # protobuf's JSON form writes these floats as strings
            return float(value.replace("Infinity", "inf"))
        return value
    raise ModelConfigError(f"field '{name}' has a value of unsupported JSON type {type(value).__name__}",
                           path)
