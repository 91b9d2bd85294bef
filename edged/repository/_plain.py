"""Turning text-format subtrees that edged does not model into plain JSON-like data (dicts, lists, scalars).

The tree is schema-less, so whether a field is repeated or a map is only known from how often it appears.
The hint sets below name the repeated and map fields of Triton's model_config.proto that these subtrees
(optimization, sequence_batching, ensemble_scheduling, ...) contain, so that a single entry still comes out as
a list (or a map as a dict), as Triton's JSON form prints it.
"""

from __future__ import annotations

from typing import Any

from edged.repository._pbtxt import Field, Ident, Message

REPEATED_HINTS = frozenset({
    "gpu_execution_accelerator", "cpu_execution_accelerator", "step", "control_input", "control", "state",
    "initial_state", "int32_false_true", "fp32_false_true", "bool_false_true", "preferred_batch_size",
    "dims", "shape", "input", "output", "batch_input", "batch_output", "source_input", "agents", "profile",
    "gpus", "secondary_devices", "resources", "op_library_filename", "graph_spec", "metric_control",
    "buckets", "versions",
})
MAP_HINTS = frozenset({"parameters", "input_map", "output_map", "cc_model_filenames", "metric_tags",
                       "input", "inputs"})
BOOL_IDENTS = {"true": True, "True": True, "t": True, "false": False, "False": False, "f": False}


def plain_value(value: Message | Ident | int | float | str) -> Any:
    if isinstance(value, Message):
        return plain_message(value)
    if isinstance(value, Ident):
        return BOOL_IDENTS.get(value.name, value.name)
    return value


def plain_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in message.names():
        out[name] = plain_fields(name, message.all(name))
    return out


def plain_fields(name: str, fields: list[Field]) -> Any:
    if name in MAP_HINTS and _all_map_entries(fields):
        return {str(plain_value(_entry(f, "key"))): _map_value(f) for f in fields}
    values = [plain_value(f.value) for f in fields]
    if len(values) == 1 and name not in REPEATED_HINTS:
        return values[0]
    return values


def _all_map_entries(fields: list[Field]) -> bool:
    return all(isinstance(f.value, Message) and set(f.value.names()) <= {"key", "value"}
               and f.value.all("key") for f in fields)


def _entry(field: Field, name: str) -> Message | Ident | int | float | str:
    if not isinstance(field.value, Message):
        return ""
    found = field.value.all(name)
    return found[-1].value if found else ""


def _map_value(field: Field) -> Any:
    return plain_value(_entry(field, "value"))
