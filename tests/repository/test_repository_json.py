"""Triton's JSON model-config form, checked against responses of real Triton servers.

The expected strings are ``GET /v2/models/{m}/config`` responses quoted verbatim in public tutorials (found
with the search tools): densenet_onnx auto-completed from its ONNX file (a recent server, with ``runtime`` and
``is_non_linear_format_io``), model_test (an ONNX model auto-completed to max_batch_size 4) and mnist_cnn
(PyTorch on one GPU), both from older servers; plus the checks of triton-inference-server/server
qa/L0_config_json/test.sh.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from edged.errors import ModelConfigError
from edged.repository import autocomplete, model_config_from_json, model_config_to_json, parse_model_config
from edged.repository.model_config import ModelSignature, TensorSignature

FIXTURES = Path(__file__).parent.parent / "fixtures" / "model_configs"

DENSENET_RESPONSE = (
    '{"name":"densenet_onnx","platform":"onnxruntime_onnx","backend":"onnxruntime","runtime":"","version_policy":'
    '{"latest":{"num_versions":1}},"max_batch_size":0,"input":[{"name":"data_0","data_type":"TYPE_FP32","format":'
    '"FORMAT_NONE","dims":[1,3,224,224],"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,'
    '"is_non_linear_format_io":false}],"output":[{"name":"fc6_1","data_type":"TYPE_FP32","dims":[1,1000,1,1],'
    '"label_filename":"","is_shape_tensor":false,"is_non_linear_format_io":false}],"batch_input":[],'
    '"batch_output":[],"optimization":{"priority":"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},'
    '"output_pinned_memory":{"enable":true},"gather_kernel_buffer_threshold":0,"eager_batching":false},'
    '"instance_group":[{"name":"densenet_onnx","kind":"KIND_CPU","count":2,"gpus":[],"secondary_devices":[],'
    '"profile":[],"passive":false,"host_policy":""}],"default_model_filename":"model.onnx",'
    '"cc_model_filenames":{},"metric_tags":{},"parameters":{},"model_warmup":[]}'
)
MODEL_TEST_RESPONSE = (
    '{"name":"model_test","platform":"onnxruntime_onnx","backend":"onnxruntime","runtime":"","version_policy":'
    '{"latest":{"num_versions":1}},"max_batch_size":4,"input":[{"name":"images","data_type":"TYPE_FP32",'
    '"format":"FORMAT_NONE","dims":[3,-1,-1],"is_shape_tensor":false,"allow_ragged_batch":false,'
    '"optional":false}],"output":[{"name":"output","data_type":"TYPE_FP32","dims":[10],"label_filename":"",'
    '"is_shape_tensor":false}],"batch_input":[],"batch_output":[],"optimization":{"priority":"PRIORITY_DEFAULT",'
    '"input_pinned_memory":{"enable":true},"output_pinned_memory":{"enable":true},'
    '"gather_kernel_buffer_threshold":0,"eager_batching":false},"dynamic_batching":{"preferred_batch_size":[4],'
    '"max_queue_delay_microseconds":0,"preserve_ordering":false,"priority_levels":0,"default_priority_level":0,'
    '"priority_queue_policy":{}},"instance_group":[{"name":"model_test","kind":"KIND_CPU","count":2,"gpus":[],'
    '"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],"default_model_filename":'
    '"model.onnx","cc_model_filenames":{},"metric_tags":{},"parameters":{},"model_warmup":[]}'
)
MNIST_RESPONSE = (
    '{"name":"mnist_cnn","platform":"pytorch_libtorch","backend":"pytorch","version_policy":{"latest":'
    '{"num_versions":1}},"max_batch_size":100,"input":[{"name":"input__0","data_type":"TYPE_FP32","format":'
    '"FORMAT_NONE","dims":[28,28,1],"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false}],'
    '"output":[{"name":"output__0","data_type":"TYPE_FP32","dims":[10],"label_filename":"","is_shape_tensor":'
    'false}],"batch_input":[],"batch_output":[],"optimization":{"priority":"PRIORITY_DEFAULT",'
    '"input_pinned_memory":{"enable":true},"output_pinned_memory":{"enable":true},'
    '"gather_kernel_buffer_threshold":0,"eager_batching":false},"dynamic_batching":{"preferred_batch_size":[50],'
    '"max_queue_delay_microseconds":0,"preserve_ordering":false,"priority_levels":0,"default_priority_level":0,'
    '"priority_queue_policy":{}},"instance_group":[{"name":"mnist_cnn_0","kind":"KIND_GPU","count":1,"gpus":[0],'
    '"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],"default_model_filename":"model.pt",'
    '"cc_model_filenames":{},"metric_tags":{},"parameters":{},"model_warmup":[]}'
)


def without(data: Any, keys: set[str]) -> Any:
    """Drop keys that newer servers add, to compare with a response from an older one."""
    if isinstance(data, dict):
        return {k: without(v, keys) for k, v in data.items() if k not in keys}
    if isinstance(data, list):
        return [without(v, keys) for v in data]
    return data


def compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))


def tensor(name: str, shape: tuple[int, ...]) -> TensorSignature:
    return TensorSignature(name, "TYPE_FP32", shape)


def test_autocompleted_fixed_shape_onnx_model_matches_a_real_response_byte_for_byte() -> None:
    signature = ModelSignature(inputs=(tensor("data_0", (1, 3, 224, 224)),),
                               outputs=(tensor("fc6_1", (1, 1000, 1, 1)),))
    config = autocomplete(None, "densenet_onnx", signature, "onnxruntime")
    assert compact(model_config_to_json(config)) == DENSENET_RESPONSE


def test_autocompleted_batching_onnx_model_matches_a_real_response() -> None:
    signature = ModelSignature(inputs=(tensor("images", (-1, 3, -1, -1)),), outputs=(tensor("output", (-1, 10)),))
    config = autocomplete(None, "model_test", signature, "onnxruntime")
    actual = without(model_config_to_json(config), {"is_non_linear_format_io"})
    assert compact(actual) == MODEL_TEST_RESPONSE


def test_gpu_pytorch_config_matches_a_real_response() -> None:
    config = parse_model_config(
        'name: "mnist_cnn" platform: "pytorch_libtorch" max_batch_size: 100\n'
        'input [{ name: "input__0" data_type: TYPE_FP32 dims: [28, 28, 1] }]\n'
        'output [{ name: "output__0" data_type: TYPE_FP32 dims: [10] }]\n'
        "dynamic_batching { preferred_batch_size: 50 }\ninstance_group [{ kind: KIND_GPU }]\n")
    actual = without(model_config_to_json(config, gpus=(0,)), {"is_non_linear_format_io", "runtime"})
    assert compact(actual) == MNIST_RESPONSE


def test_int64_fields_are_numbers_and_priority_keys_strings_as_in_triton_qa() -> None:
    config = parse_model_config((FIXTURES / "max_priority_level.pbtxt").read_text())
    text = compact(model_config_to_json(config))
    assert text.count('"priority_levels":18446744073709551615') == 1
    assert text.count('"default_priority_level":4294967295') == 1
    assert text.count('"4294967296":{"timeout_action":"REJECT","default_timeout_microseconds":'
                      '18446744073709551615,"allow_timeout_override":true,"max_queue_size":10}') == 1
    assert text.count('"default_timeout_microseconds":18446744073709551615') == 1


def test_dynamic_batching_and_version_policy_numbers_as_in_triton_qa() -> None:
    config = parse_model_config(
        'name: "m" max_batch_size: 8 version_policy: { specific: { versions: [1] }}\n'
        "input [{ name: \"I\" data_type: TYPE_FP32 dims: [16] reshape: { shape: [ 16 ]} }]\n"
        "dynamic_batching: { max_queue_delay_microseconds: 42 priority_levels: 2 default_priority_level: 1\n"
        "  default_queue_policy: { default_timeout_microseconds: 123 }\n"
        "  priority_queue_policy: { key: 1  value: { default_timeout_microseconds: 123 }}\n"
        "  priority_queue_policy: { key: 2  value: { default_timeout_microseconds: 123 }}}")
    text = compact(model_config_to_json(config))
    assert '"version_policy":{"specific":{"versions":[1]}}' in text
    assert '"max_queue_delay_microseconds":42' in text
    assert text.count('"default_timeout_microseconds":123') == 3
    assert '"reshape":{"shape":[16]}' in text
    assert '"dims":[16]' in text


def test_unknown_fields_keep_their_place_in_the_json() -> None:
    config = parse_model_config((FIXTURES / "vllm_model.pbtxt").read_text())
    data = model_config_to_json(config)
    keys = list(data)
    assert keys.index("instance_group") < keys.index("model_transaction_policy")
    assert data["model_transaction_policy"] == {"decoupled": True}
    assert "dynamic_batching" not in data


def test_warmup_and_parameters_json() -> None:
    config = parse_model_config((FIXTURES / "ort_trt_text_recognition.pbtxt").read_text())
    data = model_config_to_json(config)
    assert data["model_warmup"] == [{"name": "text_recognition", "batch_size": 16, "inputs": {
        "input.1": {"data_type": "TYPE_FP32", "dims": [1, 32, 100], "zero_data": True}}, "count": 0}]  # unset: 0
    accelerator = data["optimization"]["execution_accelerators"]["gpu_execution_accelerator"][0]
    assert accelerator["parameters"] == {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824"}
    assert data["optimization"]["priority"] == "PRIORITY_DEFAULT"


def test_json_reads_back_into_the_same_config() -> None:
    refused = ("sequence_batching {", "ensemble_scheduling {")  # refused at parse: nothing to read back
    for path in sorted(FIXTURES.glob("*.pbtxt")):
        if any(marker in path.read_text() for marker in refused):
            continue
        first = model_config_to_json(parse_model_config(path.read_text(), str(path), "m"))
        again = model_config_to_json(model_config_from_json(json.loads(json.dumps(first))))
        assert again == first, path.name


def test_integer_fields_read_from_json_take_decimal_strings_as_protobuf_json_writes_int64() -> None:
    numbers = {"name": "m", "max_batch_size": 8, "version_policy": {"specific": {"versions": [1, 3]}},
               "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 64]}],
               "dynamic_batching": {"max_queue_delay_microseconds": 100}}
    strings = {"name": "m", "max_batch_size": "8", "version_policy": {"specific": {"versions": ["1", "3"]}},
               "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["-1", "64"]}],
               "dynamic_batching": {"max_queue_delay_microseconds": "100"}}
    assert model_config_from_json(strings) == model_config_from_json(numbers)
    for bad, words in (("1" * 5000, "found a 5000-character number"), ("99999999999", "must be in [0, 2147483647]"),
                       ("8.0", "expects an integer, found string")):
        with pytest.raises(ModelConfigError, match=re.escape(words)):
            model_config_from_json({**numbers, "max_batch_size": bad})
    with pytest.raises(ModelConfigError, match="expects a quoted string"):
        model_config_from_json({**numbers, "name": 5})  # string fields stay strings: only integers convert


def test_infinite_and_nan_kept_values_are_written_as_protobuf_json_strings() -> None:
    # a double field edged keeps without modelling it (histogram buckets), given every way the text format allows
    config = parse_model_config('name: "m"\nmodel_metrics { metric_control { histogram_options { buckets: '
                                '[ -inf, 1e999, -nan, inf, 1.5, NaN ] } } }\n')
    doc = model_config_to_json(config)
    buckets = doc["model_metrics"]["metric_control"][0]["histogram_options"]["buckets"]
    assert buckets == ["-Infinity", "Infinity", "NaN", "Infinity", 1.5, "NaN"]
    text = json.dumps(doc, allow_nan=False)  # strict JSON: before, ValueError (json wrote -Infinity, orjson null)
    assert orjson.loads(orjson.dumps(doc)) == json.loads(text)
    assert model_config_to_json(model_config_from_json(json.loads(text))) == doc  # and they read back


def test_json_field_names_in_lower_camel_case_read_as_the_proto_names() -> None:
    # protobuf's JSON form names fields in lowerCamelCase unless asked otherwise (MessageToJson's default), and
    # Triton's parser takes either spelling; before, each camelCase field was kept as unknown and not applied
    # (max_batch_size stayed 0, data_type TYPE_INVALID, dynamic batching off)
    snake = {"name": "m", "max_batch_size": 8,
             "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["-1", "64"], "allow_ragged_batch": False}],
             "dynamic_batching": {"max_queue_delay_microseconds": "100", "priority_levels": "2",
                                  "default_priority_level": "1",
                                  "priority_queue_policy": {"2": {"timeout_action": "DELAY", "max_queue_size": 3}}},
             "instance_group": [{"kind": "KIND_CPU", "count": 2}],
             "parameters": {"intra_op_thread_count": {"string_value": "2"}},
             "model_warmup": [{"name": "w", "batch_size": 1,
                               "inputs": {"x": {"data_type": "TYPE_FP32", "dims": ["64"], "zero_data": True}}}],
             "default_model_filename": "net.onnx"}
    camel = {"name": "m", "maxBatchSize": 8,
             "input": [{"name": "x", "dataType": "TYPE_FP32", "dims": ["-1", "64"], "allowRaggedBatch": False}],
             "dynamicBatching": {"maxQueueDelayMicroseconds": "100", "priorityLevels": "2",
                                 "defaultPriorityLevel": "1",
                                 "priorityQueuePolicy": {"2": {"timeoutAction": "DELAY", "maxQueueSize": 3}}},
             "instanceGroup": [{"kind": "KIND_CPU", "count": 2}],
             "parameters": {"intra_op_thread_count": {"stringValue": "2"}},
             "modelWarmup": [{"name": "w", "batchSize": 1,
                              "inputs": {"x": {"dataType": "TYPE_FP32", "dims": ["64"], "zeroData": True}}}],
             "defaultModelFilename": "net.onnx"}
    read = model_config_from_json(camel)
    assert read == model_config_from_json(snake)
    assert read.max_batch_size == 8 and read.dynamic_batching is not None and not read.extra
    assert read.parameters == {"intra_op_thread_count": "2"}  # map keys are data: never renamed


def test_the_json_of_every_fixture_and_of_kept_fields_reads_into_tritons_message() -> None:
    # GET /v2/models/{m}/config and gRPC's ModelConfig (which builds Triton's message from this JSON) must give what
    # Triton's parser takes; before, `graphs: 1` gave "graphs": 1 and a batch_input's single target_name a string,
    # and gRPC's ModelConfig failed with INVALID_ARGUMENT for such a loaded model
    json_format = pytest.importorskip("google.protobuf.json_format")
    pb2 = pytest.importorskip("edged.grpcapi.proto.model_config_pb2")
    refused = ("sequence_batching {", "ensemble_scheduling {")
    texts = [path.read_text() for path in sorted(FIXTURES.glob("*.pbtxt"))
             if not any(marker in path.read_text() for marker in refused)]
    texts.append('name: "k"\noptimization { cuda { graphs: 1 } graph { level: 1 } }\n'
                 'batch_input { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_FP32 source_input: "i" }\n'
                 'batch_output { kind: 0 target_name: "o" source_input: "i" }\n'
                 'instance_group { count: 1 profile: "0" rate_limiter { resources { name: "r" count: 1 } } }\n'
                 'model_metrics { metric_control { metric_identifier { family: "f" } histogram_options { buckets: '
                 '[1, 2] } } }\nresponse_cache { enable: 1 }\n')
    for text in texts:
        doc = model_config_to_json(parse_model_config(text, None, "m"))
        json_format.ParseDict(doc, pb2.ModelConfig())  # raises ParseError where a value has another type


def test_kept_fields_of_inputs_outputs_and_instance_groups_are_reported_where_they_were_given() -> None:
    # before: GET /v2/models/{m}/config wrote each of these at its default (profile [], passive false, ...)
    config = parse_model_config(
        'name: "m"\ninput { name: "i" data_type: TYPE_FP32 dims: 4 is_non_linear_format_io: true }\n'
        'output { name: "o" data_type: TYPE_FP32 dims: 4 is_non_linear_format_io: 1 }\n'
        'instance_group [ { kind: KIND_CPU }, { kind: KIND_GPU gpus: 0 profile: [ "0", "1" ] passive: true '
        'host_policy: "numa0" secondary_devices { kind: KIND_NVDLA device_id: 1 } rate_limiter { resources { name: '
        '"r" count: 2 } priority: 3 } } ]\n')
    doc = model_config_to_json(config)
    assert doc["input"][0]["is_non_linear_format_io"] is True
    assert doc["output"][0]["is_non_linear_format_io"] is True
    first, second = doc["instance_group"]
    assert (first["profile"], first["passive"], first["host_policy"]) == ([], False, "")
    assert second["profile"] == ["0", "1"] and second["passive"] is True and second["host_policy"] == "numa0"
    assert second["secondary_devices"] == [{"kind": "KIND_NVDLA", "device_id": 1}]
    assert second["rate_limiter"] == {"resources": [{"name": "r", "count": 2}], "priority": 3}
    assert list(second) == ["name", "kind", "count", "rate_limiter", "gpus", "secondary_devices", "profile",
                            "passive", "host_policy"]  # the proto's order, as Triton prints it
    assert model_config_to_json(model_config_from_json(json.loads(json.dumps(doc)))) == doc
