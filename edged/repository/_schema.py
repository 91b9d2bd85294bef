"""Triton's ModelConfig schema (model_config.proto): every message's fields and their types, and every enum's
values in number order, as plain tables. The repository checks configs against it without protobuf (an optional
dependency): a field the schema does not have is refused, as Triton's text-format parser refuses it, and fields
edged keeps without modelling them are typed by it (a repeated field is a list even when given once, a bool written
1 is true), so the JSON edged reports is the JSON Triton's own parser reads back.

A field's type is a scalar (``bool``, ``int32``, ``uint32``, ``int64``, ``uint64``, ``float``, ``double``,
``string``), an enum or a message named as in these tables, ``*T`` for a repeated field of T, or ``map K V``.
"""

from __future__ import annotations

import difflib

# Generated from the model_config.proto that edged.grpcapi.proto ships (tests check the two agree).
MESSAGES: dict[str, dict[str, str]] = {
    "ModelConfig": {"name": "string", "platform": "string", "backend": "string", "runtime": "string",
        "version_policy": "ModelVersionPolicy", "max_batch_size": "int32", "input": "*ModelInput",
        "output": "*ModelOutput", "batch_input": "*BatchInput", "batch_output": "*BatchOutput",
        "optimization": "ModelOptimizationPolicy", "dynamic_batching": "ModelDynamicBatching",
        "sequence_batching": "ModelSequenceBatching", "ensemble_scheduling": "ModelEnsembling",
        "instance_group": "*ModelInstanceGroup", "default_model_filename": "string",
        "cc_model_filenames": "map string string", "metric_tags": "map string string",
        "parameters": "map string ModelParameter", "model_warmup": "*ModelWarmup",
        "model_operations": "ModelOperations", "model_transaction_policy": "ModelTransactionPolicy",
        "model_repository_agents": "ModelRepositoryAgents", "response_cache": "ModelResponseCache",
        "model_metrics": "ModelMetrics"},
    "ModelVersionPolicy": {"latest": "ModelVersionPolicy.Latest", "all": "ModelVersionPolicy.All",
        "specific": "ModelVersionPolicy.Specific"},
    "ModelVersionPolicy.Latest": {"num_versions": "uint32"},
    "ModelVersionPolicy.All": {},
    "ModelVersionPolicy.Specific": {"versions": "*int64"},
    "ModelInput": {"name": "string", "data_type": "DataType", "format": "ModelInput.Format", "dims": "*int64",
        "reshape": "ModelTensorReshape", "is_shape_tensor": "bool", "allow_ragged_batch": "bool", "optional": "bool",
        "is_non_linear_format_io": "bool"},
    "ModelTensorReshape": {"shape": "*int64"},
    "ModelOutput": {"name": "string", "data_type": "DataType", "dims": "*int64", "reshape": "ModelTensorReshape",
        "label_filename": "string", "is_shape_tensor": "bool", "is_non_linear_format_io": "bool"},
    "BatchInput": {"kind": "BatchInput.Kind", "target_name": "*string", "data_type": "DataType",
        "source_input": "*string"},
    "BatchOutput": {"target_name": "*string", "kind": "BatchOutput.Kind", "source_input": "*string"},
    "ModelOptimizationPolicy": {"graph": "ModelOptimizationPolicy.Graph",
        "priority": "ModelOptimizationPolicy.ModelPriority", "cuda": "ModelOptimizationPolicy.Cuda",
        "execution_accelerators": "ModelOptimizationPolicy.ExecutionAccelerators",
        "input_pinned_memory": "ModelOptimizationPolicy.PinnedMemoryBuffer",
        "output_pinned_memory": "ModelOptimizationPolicy.PinnedMemoryBuffer",
        "gather_kernel_buffer_threshold": "uint32", "eager_batching": "bool"},
    "ModelOptimizationPolicy.Graph": {"level": "int32"},
    "ModelOptimizationPolicy.Cuda": {"graphs": "bool", "busy_wait_events": "bool",
        "graph_spec": "*ModelOptimizationPolicy.Cuda.GraphSpec", "output_copy_stream": "bool"},
    "ModelOptimizationPolicy.Cuda.GraphSpec": {"batch_size": "int32",
        "input": "map string ModelOptimizationPolicy.Cuda.GraphSpec.Shape",
        "graph_lower_bound": "ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound"},
    "ModelOptimizationPolicy.Cuda.GraphSpec.Shape": {"dim": "*int64"},
    "ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound": {"batch_size": "int32",
        "input": "map string ModelOptimizationPolicy.Cuda.GraphSpec.Shape"},
    "ModelOptimizationPolicy.ExecutionAccelerators": {
        "gpu_execution_accelerator": "*ModelOptimizationPolicy.ExecutionAccelerators.Accelerator",
        "cpu_execution_accelerator": "*ModelOptimizationPolicy.ExecutionAccelerators.Accelerator"},
    "ModelOptimizationPolicy.ExecutionAccelerators.Accelerator": {"name": "string", "parameters": "map string string"},
    "ModelOptimizationPolicy.PinnedMemoryBuffer": {"enable": "bool"},
    "ModelDynamicBatching": {"preferred_batch_size": "*int32", "max_queue_delay_microseconds": "uint64",
        "preserve_ordering": "bool", "priority_levels": "uint64", "default_priority_level": "uint64",
        "default_queue_policy": "ModelQueuePolicy", "priority_queue_policy": "map uint64 ModelQueuePolicy"},
    "ModelQueuePolicy": {"timeout_action": "ModelQueuePolicy.TimeoutAction", "default_timeout_microseconds": "uint64",
        "allow_timeout_override": "bool", "max_queue_size": "uint32"},
    "ModelSequenceBatching": {"direct": "ModelSequenceBatching.StrategyDirect",
        "oldest": "ModelSequenceBatching.StrategyOldest", "max_sequence_idle_microseconds": "uint64",
        "control_input": "*ModelSequenceBatching.ControlInput", "state": "*ModelSequenceBatching.State",
        "iterative_sequence": "bool"},
    "ModelSequenceBatching.StrategyDirect": {"max_queue_delay_microseconds": "uint64",
        "minimum_slot_utilization": "float"},
    "ModelSequenceBatching.StrategyOldest": {"max_candidate_sequences": "int32", "preferred_batch_size": "*int32",
        "max_queue_delay_microseconds": "uint64", "preserve_ordering": "bool"},
    "ModelSequenceBatching.ControlInput": {"name": "string", "control": "*ModelSequenceBatching.Control"},
    "ModelSequenceBatching.Control": {"kind": "ModelSequenceBatching.Control.Kind", "int32_false_true": "*int32",
        "fp32_false_true": "*float", "bool_false_true": "*bool", "data_type": "DataType"},
    "ModelSequenceBatching.State": {"input_name": "string", "output_name": "string", "data_type": "DataType",
        "dims": "*int64", "initial_state": "*ModelSequenceBatching.InitialState",
        "use_same_buffer_for_input_output": "bool", "use_growable_memory": "bool"},
    "ModelSequenceBatching.InitialState": {"data_type": "DataType", "dims": "*int64", "zero_data": "bool",
        "data_file": "string", "name": "string"},
    "ModelEnsembling": {"step": "*ModelEnsembling.Step", "max_inflight_requests": "uint32"},
    "ModelEnsembling.Step": {"model_name": "string", "model_version": "int64", "input_map": "map string string",
        "output_map": "map string string", "model_namespace": "string"},
    "ModelInstanceGroup": {"name": "string", "kind": "ModelInstanceGroup.Kind", "count": "int32",
        "rate_limiter": "ModelRateLimiter", "gpus": "*int32",
        "secondary_devices": "*ModelInstanceGroup.SecondaryDevice", "profile": "*string", "passive": "bool",
        "host_policy": "string"},
    "ModelRateLimiter": {"resources": "*ModelRateLimiter.Resource", "priority": "uint32"},
    "ModelRateLimiter.Resource": {"name": "string", "global": "bool", "count": "uint32"},
    "ModelInstanceGroup.SecondaryDevice": {"kind": "ModelInstanceGroup.SecondaryDevice.SecondaryDeviceKind",
        "device_id": "int64"},
    "ModelParameter": {"string_value": "string"},
    "ModelWarmup": {"name": "string", "batch_size": "uint32", "inputs": "map string ModelWarmup.Input",
        "count": "uint32"},
    "ModelWarmup.Input": {"data_type": "DataType", "dims": "*int64", "zero_data": "bool", "random_data": "bool",
        "input_data_file": "string"},
    "ModelOperations": {"op_library_filename": "*string"},
    "ModelTransactionPolicy": {"decoupled": "bool"},
    "ModelRepositoryAgents": {"agents": "*ModelRepositoryAgents.Agent"},
    "ModelRepositoryAgents.Agent": {"name": "string", "parameters": "map string string"},
    "ModelResponseCache": {"enable": "bool"},
    "ModelMetrics": {"metric_control": "*ModelMetrics.MetricControl"},
    "ModelMetrics.MetricControl": {"metric_identifier": "ModelMetrics.MetricControl.MetricIdentifier",
        "histogram_options": "ModelMetrics.MetricControl.HistogramOptions"},
    "ModelMetrics.MetricControl.MetricIdentifier": {"family": "string"},
    "ModelMetrics.MetricControl.HistogramOptions": {"buckets": "*double"},
}
ENUMS: dict[str, tuple[str, ...]] = {
    "DataType": ("TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8",
        "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_BF16"),
    "ModelInput.Format": ("FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"),
    "BatchInput.Kind": ("BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT",
        "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "BATCH_ITEM_SHAPE",
        "BATCH_ITEM_SHAPE_FLATTEN"),
    "BatchOutput.Kind": ("BATCH_SCATTER_WITH_INPUT_SHAPE",),
    "ModelOptimizationPolicy.ModelPriority": ("PRIORITY_DEFAULT", "PRIORITY_MAX", "PRIORITY_MIN"),
    "ModelQueuePolicy.TimeoutAction": ("REJECT", "DELAY"),
    "ModelSequenceBatching.Control.Kind": ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_END",
        "CONTROL_SEQUENCE_CORRID"),
    "ModelInstanceGroup.Kind": ("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"),
    "ModelInstanceGroup.SecondaryDevice.SecondaryDeviceKind": ("KIND_NVDLA",),
}

INTEGERS: dict[str, tuple[int, int]] = {
    "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1),
}
FLOATS = frozenset({"float", "double"})


def field_type(message: str | None, name: str) -> str | None:
    """The type of ``message``'s field ``name``; None when the message has no such field (or is not known)."""
    return None if message is None else MESSAGES.get(message, {}).get(name)


def element(kind: str) -> str:
    """The type of one value of a field: a repeated field's element type, others as they are."""
    return kind[1:] if kind.startswith("*") else kind


def map_types(kind: str) -> tuple[str, str] | None:
    """A map field's key and value types; None for other fields."""
    if not kind.startswith("map "):
        return None
    _, key, value = kind.split(" ")
    return key, value


def unknown_field(message: str, name: str) -> str:
    """Why ``name`` is not a field of ``message``, with the field it most likely means."""
    fields = list(MESSAGES.get(message, {}))
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.75)
    hint = f"did you mean '{close[0]}'?" if close else f"its fields are {', '.join(fields) or 'none'}"
    return f"Triton's {message} has no such field, and Triton refuses the config too ({hint})"
