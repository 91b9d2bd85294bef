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
from edged.repository.model_config import ModelConfig

_ENUM_FIELDS = frozenset({"data_type", "format", "kind", "timeout_action", "priority"})
_MAP_FIELDS = frozenset({"parameters", "priority_queue_policy", "inputs", "cc_model_filenames", "metric_tags",
                         "input_map", "output_map"})
_INT_KEY_MAPS = frozenset({"priority_queue_policy"})
# Fields Triton's normalization adds with their default value; dropped so they do not show up as "unknown".
_CAMEL_HUMP = re.compile(r"[A-Z]")
_DEFAULTS = {"runtime": "", "batch_input": [], "batch_output": [], "cc_model_filenames": {},
             "metric_tags": {}}


def model_config_from_json(data: dict[str, Any], path: str | None = None) -> ModelConfig:
    if not isinstance(data, dict):
        raise ModelConfigError(f"a model config in JSON must be an object, found {type(data).__name__}", path)
    cleaned = {_proto_name(str(key)): value for key, value in data.items()}
    cleaned = {key: value for key, value in cleaned.items() if _DEFAULTS.get(key, ...) != value}
    return build_model_config(_message(cleaned, path), path, int_strings=True)


def _message(data: dict[str, Any], path: str | None) -> Message:
    fields: list[Field] = []
    for name, value in data.items():
        fields.extend(_fields(_proto_name(str(name)), value, path))
    return Message(tuple(fields))


def _proto_name(name: str) -> str:
    """A field name as the proto spells it: protobuf's JSON name is its lowerCamelCase (``max_batch_size`` is
    ``maxBatchSize``); Triton's fields are lower case, so every capital starts a word."""
    return _CAMEL_HUMP.sub(lambda hump: "_" + hump.group().lower(), name)


def _fields(name: str, value: Any, path: str | None) -> list[Field]:
    if name in _MAP_FIELDS and isinstance(value, dict):
        return [Field(name, _entry(name, key, item, path)) for key, item in value.items()]
    if isinstance(value, list):
        return [Field(name, _value(name, item, path)) for item in value]
    return [Field(name, _value(name, value, path))]


def _entry(name: str, key: str, item: Any, path: str | None) -> Message:
    key_value: int | str = key
    if name in _INT_KEY_MAPS:
        if not (key.isascii() and key.isdigit() and len(key) <= 20):  # '²' is a digit to isdigit, not to int()
            raise ModelConfigError(f"field '{name}' expects integer keys, found {key!r}", path)
        key_value = int(key)
    return Message((Field("key", key_value), Field("value", _value("value", item, path))))


def _value(name: str, value: Any, path: str | None) -> Message | Ident | int | float | str:
    if isinstance(value, dict):
        return _message(value, path)
    if isinstance(value, bool):
        return Ident("true" if value else "false")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        if name in _ENUM_FIELDS:
            return Ident(value)
        return value
    raise ModelConfigError(f"field '{name}' has a value of unsupported JSON type {type(value).__name__}",
                           path)
