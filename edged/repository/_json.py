"""Triton's JSON form of a model config, as ``GET /v2/models/{m}/config`` returns it.

Triton prints the normalized ModelConfig protobuf with MessageToJsonString(preserve_proto_field_names,
always_print_primitive_fields) and then turns the int64/uint64 fields back into JSON numbers
(ModelConfigToJson in triton-inference-server/core src/model_config_utils.cc); map keys stay strings. So:
every scalar and repeated field is printed, defaults included; a message field only when set; keys in the
proto's declaration order; int64 values (dims, max_queue_delay_microseconds, ...) as numbers.
Checked against responses of real servers (see tests/repository/test_repository_json.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from edged.repository._normalize import normalize
from edged.repository.model_config import (
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    ModelWarmup,
    QueuePolicy,
    TensorConfig,
    VersionPolicy,
)

# The top-level fields of model_config.proto in declaration order, which is the order Triton prints them in.
_ORDER = ("name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input", "output",
          "batch_input", "batch_output", "optimization", "dynamic_batching", "sequence_batching",
          "ensemble_scheduling", "instance_group", "default_model_filename", "cc_model_filenames",
          "metric_tags", "parameters", "model_warmup", "model_operations", "model_transaction_policy",
          "model_repository_agents", "response_cache", "model_metrics")
# What Triton's NormalizeModelConfig puts into every non-ensemble config's optimization.
_OPTIMIZATION_DEFAULTS: dict[str, Any] = {
    "priority": "PRIORITY_DEFAULT",
    "input_pinned_memory": {"enable": True},
    "output_pinned_memory": {"enable": True},
    "gather_kernel_buffer_threshold": 0,
    "eager_batching": False,
}


def model_config_to_json(config: ModelConfig, gpus: Sequence[int] = ()) -> dict[str, Any]:
    """The config as Triton's JSON model-config (normalized first, as Triton serves it)."""
    config = normalize(config, gpus)
    ensemble = "ensemble_scheduling" in config.extra
    out: dict[str, Any] = {
        "name": config.name,
        "platform": config.platform,
        "backend": config.backend,
        "runtime": config.extra.get("runtime", ""),
        "version_policy": _version_policy(config.version_policy),
        "max_batch_size": config.max_batch_size,
        "input": [_input(t, _kept(config.extra, f"input[{i}].")) for i, t in enumerate(config.input)],
        "output": [_output(t, _kept(config.extra, f"output[{i}].")) for i, t in enumerate(config.output)],
        "batch_input": config.extra.get("batch_input", []),
        "batch_output": config.extra.get("batch_output", []),
    }
    if not ensemble:
        out["optimization"] = {**_OPTIMIZATION_DEFAULTS, **_finite(config.optimization)}
    elif config.optimization:
        out["optimization"] = _finite(config.optimization)
    if config.dynamic_batching is not None:
        out["dynamic_batching"] = _dynamic_batching(config.dynamic_batching)
    out["instance_group"] = [_instance_group(g, _kept(config.extra, f"instance_group[{i}]."))
                             for i, g in enumerate(config.instance_group)]
    out["default_model_filename"] = config.default_model_filename
    out["cc_model_filenames"] = config.extra.get("cc_model_filenames", {})
    out["metric_tags"] = config.extra.get("metric_tags", {})
    out["parameters"] = {key: {"string_value": value} for key, value in config.parameters.items()}
    out["model_warmup"] = [_warmup(w) for w in config.model_warmup]
    return _with_extra(out, _finite(config.extra))


def _finite(value: Any) -> Any:
    """Kept values with inf and nan written as protobuf's JSON form does, as the strings "Infinity", "-Infinity"
    and "NaN": JSON has no such numbers (json.dumps wrote -Infinity, which strict parsers refuse; orjson null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def _kept(extra: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The kept fields of one input, output or instance group (``extra`` keys under ``prefix``), by field name."""
    return {key[len(prefix):]: _finite(value) for key, value in extra.items() if key.startswith(prefix)}


def _with_extra(out: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    top = {key: value for key, value in extra.items() if key.isidentifier() and key not in out}
    if not top:
        return out
    rank = {name: index for index, name in enumerate(_ORDER)}
    known = sorted((*out.items(), *((k, v) for k, v in top.items() if k in rank)), key=lambda kv: rank[kv[0]])
    # Fields Triton's proto does not know go at the end, in file order.
    return dict(known) | {k: v for k, v in top.items() if k not in rank}


def _version_policy(policy: VersionPolicy) -> dict[str, Any]:
    if policy.kind == "all":
        return {"all": {}}
    if policy.kind == "specific":
        return {"specific": {"versions": list(policy.versions)}}
    return {"latest": {"num_versions": policy.num_versions}}


def _reshape(tensor: TensorConfig, out: dict[str, Any]) -> None:
    if tensor.reshape is not None:
        out["reshape"] = {"shape": list(tensor.reshape.shape)}


def _input(tensor: TensorConfig, kept: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tensor.name, "data_type": tensor.data_type, "format": tensor.format,
                           "dims": list(tensor.dims)}
    _reshape(tensor, out)
    out.update(is_shape_tensor=tensor.is_shape_tensor, allow_ragged_batch=tensor.allow_ragged_batch,
               optional=tensor.optional, is_non_linear_format_io=kept.get("is_non_linear_format_io", False))
    return out


def _output(tensor: TensorConfig, kept: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tensor.name, "data_type": tensor.data_type, "dims": list(tensor.dims)}
    _reshape(tensor, out)
    out.update(label_filename=tensor.label_filename, is_shape_tensor=tensor.is_shape_tensor,
               is_non_linear_format_io=kept.get("is_non_linear_format_io", False))
    return out


def _queue_policy(policy: QueuePolicy) -> dict[str, Any]:
    return {"timeout_action": policy.timeout_action,
            "default_timeout_microseconds": policy.default_timeout_microseconds,
            "allow_timeout_override": policy.allow_timeout_override, "max_queue_size": policy.max_queue_size}


def _dynamic_batching(batching: DynamicBatching) -> dict[str, Any]:
    out: dict[str, Any] = {
        "preferred_batch_size": list(batching.preferred_batch_size),
        "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
        "preserve_ordering": batching.preserve_ordering,
        "priority_levels": batching.priority_levels,
        "default_priority_level": batching.default_priority_level,
    }
    # A message field is printed only when set; edged cannot tell "set to the defaults" from "not set".
    if batching.default_queue_policy != QueuePolicy():
        out["default_queue_policy"] = _queue_policy(batching.default_queue_policy)
    out["priority_queue_policy"] = {str(level): _queue_policy(policy)
                                    for level, policy in sorted(batching.priority_queue_policy.items())}
    return out


def _instance_group(group: InstanceGroup, kept: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": group.name, "kind": group.kind, "count": group.count}
    if "rate_limiter" in kept:  # a message field: printed only when set
        out["rate_limiter"] = kept["rate_limiter"]
    out.update(gpus=list(group.gpus), secondary_devices=kept.get("secondary_devices", []),
               profile=kept.get("profile", []), passive=kept.get("passive", False),
               host_policy=kept.get("host_policy", ""))
    return out


def _warmup(warmup: ModelWarmup) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    for name, spec in warmup.inputs.items():
        entry: dict[str, Any] = {"data_type": spec.data_type, "dims": list(spec.dims)}
        entry[spec.source] = spec.input_data_file if spec.source == "input_data_file" else True
        inputs[name] = entry
    return {"name": warmup.name, "batch_size": warmup.batch_size, "inputs": inputs, "count": warmup.count}
