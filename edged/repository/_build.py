"""Building a typed `ModelConfig` from a parsed text-format tree.

Field types follow Triton's model_config.proto (int32/uint32/int64/uint64 ranges, enums by name or number,
non-repeated fields given once). Fields of the schema (``_schema``) edged does not model are kept in ``extra`` as
plain data of their schema types, keyed by their dotted path (``instance_group[0].profile``), and reported; a field
the schema does not have is refused at its position, as protobuf's parser refuses it. The schedulers edged does not
implement (``sequence_batching``, ``ensemble_scheduling``) are refused too: serving such a model as if it were
stateless would give wrong answers.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, cast

from edged.repository._fields import INT32, INT64, UINT32, UINT64, Reader, one
from edged.repository._pbtxt import Field, Message, parse
from edged.repository.model_config import (
    TRITON_TO_KSERVE,
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    ModelWarmup,
    QueuePolicy,
    Reshape,
    TensorConfig,
    VersionPolicy,
    WarmupInput,
)

logger = logging.getLogger(__name__)

DATA_TYPES: tuple[str, ...] = tuple(TRITON_TO_KSERVE)
# Enum values in proto order, so that an enum given by number maps to its name.
DATA_TYPE_BY_NUMBER: tuple[str, ...] = (
    "TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8",
    "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING",
    "TYPE_BF16",
)
FORMATS: tuple[str, ...] = ("FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW")
KINDS: tuple[str, ...] = ("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL")
TIMEOUT_ACTIONS: tuple[str, ...] = ("REJECT", "DELAY")
Kind = Literal["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"]
TimeoutAction = Literal["REJECT", "DELAY"]
Source = Literal["zero_data", "random_data", "input_data_file"]

_TOP = frozenset({"name", "platform", "backend", "max_batch_size", "input", "output", "version_policy",
                  "instance_group", "dynamic_batching", "parameters", "model_warmup",
                  "default_model_filename", "optimization"})
# Schedulers whose semantics (per-sequence state, a pipeline of models) edged does not implement.
_REFUSED_TOP = {
    "sequence_batching": "stateful (sequence) models are not supported by edged; serve the model without "
                         "sequence_batching only if it keeps no state between requests",
    "ensemble_scheduling": "ensembles are not supported by edged; run the steps as separate models",
}
_REPEATED_TOP = frozenset({"input", "output", "instance_group", "parameters", "model_warmup"})
_INPUT = frozenset({"name", "data_type", "format", "dims", "reshape", "is_shape_tensor", "allow_ragged_batch",
                    "optional"})
_OUTPUT = frozenset({"name", "data_type", "dims", "reshape", "label_filename", "is_shape_tensor"})
# Triton takes any uint64 delay; a thread cannot wait that long (Condition.wait overflows time_t) and no batch is
# worth waiting a day for, so longer delays are refused where they are written.
MAX_QUEUE_DELAY_US = 86_400 * 1_000_000
_QUEUE = frozenset({"timeout_action", "default_timeout_microseconds", "allow_timeout_override",
                    "max_queue_size"})
_BATCHING = frozenset({"preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering",
                       "priority_levels", "default_priority_level", "default_queue_policy",
                       "priority_queue_policy"})


def parse_model_config(text: str, path: str | None = None, default_name: str = "") -> ModelConfig:
    """Parse config.pbtxt text into a ModelConfig; the name defaults to ``default_name`` when absent."""
    return build_model_config(parse(text, path), path, default_name)


def build_model_config(tree: Message, path: str | None = None, default_name: str = "",
                       int_strings: bool = False) -> ModelConfig:
    """``int_strings``: the tree comes from protobuf's JSON form, where integers may be strings."""
    reader = Reader(path, int_strings=int_strings)
    _refuse_unsupported_schedulers(reader, tree)
    groups = reader.group(tree, "", _TOP, _REPEATED_TOP, of="ModelConfig")
    config = ModelConfig(
        name=_text(reader, groups, "name") or default_name,
        platform=_text(reader, groups, "platform"),
        backend=_text(reader, groups, "backend"),
        max_batch_size=_max_batch_size(reader, groups),
        input=tuple(_tensor(reader, f, f"input[{i}].", True) for i, f in enumerate(groups.get("input", []))),
        output=tuple(_tensor(reader, f, f"output[{i}].", False)
                     for i, f in enumerate(groups.get("output", []))),
        version_policy=_version_policy(reader, one(groups, "version_policy")),
        instance_group=tuple(_instance_group(reader, f, f"instance_group[{i}].")
                             for i, f in enumerate(groups.get("instance_group", []))),
        dynamic_batching=_dynamic_batching(reader, one(groups, "dynamic_batching")),
        parameters=_parameters(reader, groups.get("parameters", [])),
        model_warmup=tuple(_warmup(reader, f, f"model_warmup[{i}].")
                           for i, f in enumerate(groups.get("model_warmup", []))),
        default_model_filename=_text(reader, groups, "default_model_filename"),
        optimization=_optimization(reader, one(groups, "optimization")),
        extra=reader.extra,
    )
    for kind, specs in (("input", config.input), ("output", config.output)):
        _refuse_repeated_names(reader, kind, specs, groups.get(kind, []))
    if reader.extra:
        logger.info("model %s: fields kept but not applied by edged: %s", config.name or default_name,
                    ", ".join(reader.extra))
    return config


def _refuse_unsupported_schedulers(reader: Reader, tree: Message) -> None:
    for item in tree.fields:
        reason = _REFUSED_TOP.get(item.name)
        if reason is not None:
            raise reader.error(f"field '{item.name}': {reason}", item)


def _refuse_repeated_names(reader: Reader, kind: str, specs: tuple[TensorConfig, ...], items: list[Field]) -> None:
    first: dict[str, int] = {}
    for index, (spec, item) in enumerate(zip(specs, items, strict=True)):
        if spec.name in first:
            raise reader.error(f"{kind}[{index}] is named {spec.name!r} like {kind}[{first[spec.name]}]; each {kind} "
                               "needs its own name", item.value if isinstance(item.value, Message) else item)
        first[spec.name] = index


def unknown_fields(config: ModelConfig) -> list[str]:
    """The fields of a config that edged keeps but does not model, by dotted path."""
    return list(config.extra)


def _text(reader: Reader, groups: dict[str, list[Field]], name: str) -> str:
    item = one(groups, name)
    return "" if item is None else reader.string(item, "")


def _max_batch_size(reader: Reader, groups: dict[str, list[Field]]) -> int:
    item = one(groups, "max_batch_size")
    return 0 if item is None else reader.integer(item, "", (0, INT32[1]))


def _dims(reader: Reader, items: list[Field] | None, where: str) -> tuple[int, ...]:
    dims = reader.ints(items, where, INT64)
    for item, dim in zip(items or [], dims, strict=True):
        # Triton rejects 0: a dimension is >= 1, or -1 for a variable size.
        if dim < -1 or dim == 0:
            raise reader.error(f"field '{where}{item.name}' must be an integer >= 1, or -1 for a "
                               f"variable-size dimension; found {dim}", item)
    return dims


def _tensor(reader: Reader, item: Field, where: str, is_input: bool) -> TensorConfig:
    groups = reader.group(reader.message(item, ""), where, _INPUT if is_input else _OUTPUT,
                          frozenset({"dims"}), of="ModelInput" if is_input else "ModelOutput")
    reshape_field = one(groups, "reshape")
    reshape = None
    if reshape_field is not None:
        shape_groups = reader.group(reader.message(reshape_field, where), f"{where}reshape.",
                                    frozenset({"shape"}), frozenset({"shape"}), of="ModelTensorReshape")
        reshape = Reshape(_dims(reader, shape_groups.get("shape"), f"{where}reshape."))
    return TensorConfig(
        name=_text_at(reader, groups, "name", where),
        data_type=_data_type(reader, groups, where),
        dims=_dims(reader, groups.get("dims"), where),
        reshape=reshape,
        format=_enum_at(reader, groups, "format", where, allowed=FORMATS, default="FORMAT_NONE"),
        optional=_bool_at(reader, groups, "optional", where),
        is_shape_tensor=_bool_at(reader, groups, "is_shape_tensor", where),
        allow_ragged_batch=_bool_at(reader, groups, "allow_ragged_batch", where),
        label_filename=_text_at(reader, groups, "label_filename", where),
    )


def _text_at(reader: Reader, groups: dict[str, list[Field]], name: str, where: str) -> str:
    item = one(groups, name)
    return "" if item is None else reader.string(item, where)


def _bool_at(reader: Reader, groups: dict[str, list[Field]], name: str, where: str) -> bool:
    item = one(groups, name)
    return False if item is None else reader.boolean(item, where)


def _int_at(reader: Reader, groups: dict[str, list[Field]], name: str, where: str, *,
            bounds: tuple[int, int], default: int = 0) -> int:
    item = one(groups, name)
    return default if item is None else reader.integer(item, where, bounds)


def _enum_at(reader: Reader, groups: dict[str, list[Field]], name: str, where: str, *,
             allowed: tuple[str, ...], default: str) -> str:
    item = one(groups, name)
    if item is None:
        return default
    value = reader.enum(item, where, allowed)
    if allowed is DATA_TYPE_BY_NUMBER and value == "TYPE_INVALID":
        raise reader.error(f"field '{where}{name}' expects one of {', '.join(DATA_TYPES)}; found "
                           "TYPE_INVALID", item)
    return value


def _data_type(reader: Reader, groups: dict[str, list[Field]], where: str) -> str:
    return _enum_at(reader, groups, "data_type", where, allowed=DATA_TYPE_BY_NUMBER, default="TYPE_INVALID")


def _version_policy(reader: Reader, item: Field | None) -> VersionPolicy:
    if item is None:
        return VersionPolicy()
    where = "version_policy."
    groups = reader.group(reader.message(item, ""), where, frozenset({"latest", "all", "specific"}),
                          of="ModelVersionPolicy")
    if len(groups) != 1:
        raise reader.error(f"field 'version_policy' expects exactly one of latest, all, specific; found "
                           f"{', '.join(groups) or 'none'}", item)
    kind, items = next(iter(groups.items()))
    body = reader.message(items[0], where)
    if kind == "all":
        reader.group(body, f"{where}all.", frozenset(), of="ModelVersionPolicy.All")
        return VersionPolicy(kind="all")
    if kind == "latest":
        latest = reader.group(body, f"{where}latest.", frozenset({"num_versions"}), of="ModelVersionPolicy.Latest")
        count = _int_at(reader, latest, "num_versions", f"{where}latest.", bounds=(1, UINT32[1]), default=1)
        return VersionPolicy(kind="latest", num_versions=count)
    specific = reader.group(body, f"{where}specific.", frozenset({"versions"}), frozenset({"versions"}),
                            of="ModelVersionPolicy.Specific")
    versions = reader.ints(specific.get("versions"), f"{where}specific.", INT64)
    return VersionPolicy(kind="specific", versions=versions)


def _instance_group(reader: Reader, item: Field, where: str) -> InstanceGroup:
    groups = reader.group(reader.message(item, ""), where, frozenset({"name", "kind", "count", "gpus"}),
                          frozenset({"gpus"}), of="ModelInstanceGroup")
    kind = _enum_at(reader, groups, "kind", where, allowed=KINDS, default="KIND_AUTO")
    # count 0 is protobuf's "not given": normalize() applies Triton's default for the kind and backend.
    return InstanceGroup(
        name=_text_at(reader, groups, "name", where),
        kind=cast(Kind, kind),
        count=_int_at(reader, groups, "count", where, bounds=(0, INT32[1])),
        gpus=reader.ints(groups.get("gpus"), where, (0, INT32[1])),
    )


def _queue_policy(reader: Reader, item: Field | None, where: str) -> QueuePolicy:
    if item is None:
        return QueuePolicy()
    groups = reader.group(reader.message(item, where), f"{where}{item.name}.", _QUEUE, of="ModelQueuePolicy")
    inner = f"{where}{item.name}."
    return QueuePolicy(
        timeout_action=cast(TimeoutAction, _enum_at(reader, groups, "timeout_action", inner,
                                                     allowed=TIMEOUT_ACTIONS, default="REJECT")),
        default_timeout_microseconds=_int_at(reader, groups, "default_timeout_microseconds", inner,
                                             bounds=UINT64),
        allow_timeout_override=_bool_at(reader, groups, "allow_timeout_override", inner),
        max_queue_size=_int_at(reader, groups, "max_queue_size", inner, bounds=(0, INT32[1])),
    )


def _dynamic_batching(reader: Reader, item: Field | None) -> DynamicBatching | None:
    if item is None:
        return None
    where = "dynamic_batching."
    groups = reader.group(reader.message(item, ""), where, _BATCHING,
                          frozenset({"preferred_batch_size", "priority_queue_policy"}), of="ModelDynamicBatching")
    levels = _int_at(reader, groups, "priority_levels", where, bounds=UINT64)
    default_level = _int_at(reader, groups, "default_priority_level", where, bounds=UINT64)
    if levels and not 1 <= default_level <= levels:
        raise reader.error(f"field '{where}default_priority_level' must be in [1, {levels}] when "
                           f"priority_levels is {levels}; found {default_level}",
                           one(groups, "default_priority_level") or item)
    return DynamicBatching(
        preferred_batch_size=reader.ints(groups.get("preferred_batch_size"), where, (1, INT32[1])),
        max_queue_delay_microseconds=_queue_delay(reader, groups, where),
        preserve_ordering=_bool_at(reader, groups, "preserve_ordering", where),
        priority_levels=levels,
        default_priority_level=default_level,
        default_queue_policy=_queue_policy(reader, one(groups, "default_queue_policy"), where),
        priority_queue_policy=_priority_policies(reader, groups.get("priority_queue_policy", []), levels),
    )


def _queue_delay(reader: Reader, groups: dict[str, list[Field]], where: str) -> int:
    delay = _int_at(reader, groups, "max_queue_delay_microseconds", where, bounds=UINT64)
    item = one(groups, "max_queue_delay_microseconds")
    if item is not None and delay > MAX_QUEUE_DELAY_US:
        raise reader.error(f"field '{where}max_queue_delay_microseconds' is {delay}, more than a day "
                           f"({MAX_QUEUE_DELAY_US} µs), the longest batching delay edged waits; a batching delay is "
                           "usually a few hundred to a few thousand microseconds", item)
    return delay


def _priority_policies(reader: Reader, items: list[Field], levels: int) -> dict[int, QueuePolicy]:
    where = "dynamic_batching."
    policies: dict[int, QueuePolicy] = {}
    for entry, key, value in reader.map_entries(items, where):
        level = 0 if key is None else reader.integer(key, f"{where}priority_queue_policy.", UINT64)
        if not 1 <= level <= levels:
            raise reader.error(f"field '{where}priority_queue_policy' key must be a priority level in "
                               f"[1, {levels}]; found {level}", key or entry)
        policies[level] = _queue_policy(reader, value, f"{where}priority_queue_policy.")
    return policies


def _parameters(reader: Reader, items: list[Field]) -> dict[str, str]:
    params: dict[str, str] = {}
    for _entry, key, value in reader.map_entries(items, ""):
        name = "" if key is None else reader.string(key, "parameters.")
        text = ""
        if value is not None:
            groups = reader.group(reader.message(value, "parameters."), "parameters.value.",
                                  frozenset({"string_value"}), of="ModelParameter")
            text = _text_at(reader, groups, "string_value", "parameters.value.")
        params[name] = text
    return params


def _warmup(reader: Reader, item: Field, where: str) -> ModelWarmup:
    groups = reader.group(reader.message(item, ""), where,
                          frozenset({"name", "batch_size", "inputs", "count"}), frozenset({"inputs"}), of="ModelWarmup")
    inputs: dict[str, WarmupInput] = {}
    for _entry, key, value in reader.map_entries(groups.get("inputs", []), where):
        name = "" if key is None else reader.string(key, f"{where}inputs.")
        inputs[name] = _warmup_input(reader, value, f"{where}inputs[{name}].")
    return ModelWarmup(
        name=_text_at(reader, groups, "name", where),
        batch_size=_int_at(reader, groups, "batch_size", where, bounds=UINT32),
        inputs=inputs,
        count=_int_at(reader, groups, "count", where, bounds=UINT32),
    )


def _warmup_input(reader: Reader, item: Field | None, where: str) -> WarmupInput:
    if item is None:
        return WarmupInput(data_type="TYPE_INVALID", dims=())
    sources = ("zero_data", "random_data", "input_data_file")
    groups = reader.group(reader.message(item, where), where, frozenset({"data_type", "dims", *sources}),
                          frozenset({"dims"}), of="ModelWarmup.Input")
    given = [name for name in sources if name in groups]
    if len(given) > 1:
        raise reader.error(f"warm-up input '{where[:-1]}' sets {' and '.join(given)}; expected exactly one",
                           item)
    source = given[0] if given else "zero_data"
    return WarmupInput(
        data_type=_data_type(reader, groups, where),
        dims=reader.ints(groups.get("dims"), where, INT64),
        source=cast(Source, source),
        input_data_file=_text_at(reader, groups, "input_data_file", where),
    )


def _optimization(reader: Reader, item: Field | None) -> dict[str, Any]:
    if item is None:
        return {}
    value = reader.kept([item], "ModelOptimizationPolicy", "")
    assert isinstance(value, dict)  # a message's kept value is a dict (a scalar was refused by reader.message)
    return value
