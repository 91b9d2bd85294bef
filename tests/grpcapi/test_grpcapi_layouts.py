"""The repeated-layout fast paths of ModelInfer (edged.grpcapi._layouts) against protobuf's parser and
``decode_infer`` / ``encode_infer`` on the same bytes: a layout is reused only for a request the parser would
read the same way, and a response parses to the message ``encode_infer`` builds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edged.engine import InferResponse
from edged.errors import InvalidInput
from edged.grpcapi._layouts import _ENTRIES, _PREFIX_BYTES, RequestLayouts, ResponseLayouts
from edged.grpcapi._tensors import Decoded, OutputSpec, decode_infer, encode_infer
from edged.grpcapi.proto import grpc_service_pb2 as pb
from edged.protocol.shm_params import ShmReference
from edged.shm import TCP_CALLER, SharedMemoryRegistry

MAX_ELEMENTS = 1 << 20
REGISTRY = SharedMemoryRegistry()


def _read(reference: ShmReference) -> memoryview:
    return REGISTRY.readable(reference, TCP_CALLER)


def _write(reference: ShmReference) -> memoryview:
    return REGISTRY.writable(reference, TCP_CALLER)


def _request(values: np.ndarray[Any, Any], model: str = "tiny_mlp", shape: tuple[int, ...] = (1, 64),
             datatype: str = "FP32", outputs: tuple[str, ...] = ()) -> bytes:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="input", datatype=datatype, shape=shape)
    for name in outputs:
        message.outputs.add(name=name)
    message.raw_input_contents.append(values.tobytes())
    return message.SerializeToString()


def _slow(data: bytes) -> Decoded:
    return decode_infer(pb.ModelInferRequest.FromString(data), MAX_ELEMENTS, _read)


def _same(fast: Decoded, slow: Decoded) -> None:
    a, b = fast.request, slow.request
    assert (a.model, a.version, a.id, a.outputs, a.parameters, a.priority, a.timeout_us) == \
        (b.model, b.version, b.id, b.outputs, b.parameters, b.priority, b.timeout_us)
    assert a.inputs.keys() == b.inputs.keys()
    for name, array in a.inputs.items():
        assert array.dtype == b.inputs[name].dtype and array.shape == b.inputs[name].shape
        assert np.array_equal(array, b.inputs[name])
    assert fast.outputs == slow.outputs


def _values(seed: int, count: int = 64) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).random(count, np.float32)


def test_a_repeated_request_layout_is_reused_with_the_new_tensor_bytes() -> None:
    layouts = RequestLayouts(MAX_ELEMENTS, _read)
    first, second = _request(_values(1), outputs=("output",)), _request(_values(2), outputs=("output",))
    _same(layouts.decode(first), _slow(first))
    decoded = layouts.decode(second)
    assert layouts.hits == 1
    _same(decoded, _slow(second))
    assert np.array_equal(decoded.request.inputs["input"].ravel(), _values(2))


@pytest.mark.parametrize("other", [
    {"shape": (2, 32)},  # the same byte length under another shape
    {"model": "tiny_mlq"},  # one byte of the model's name
    {"datatype": "INT32"},  # the same byte length under another datatype
    {"outputs": ("output",)},
])
def test_a_request_differing_before_its_tensors_does_not_reuse_the_layout(other: dict[str, Any]) -> None:
    layouts = RequestLayouts(MAX_ELEMENTS, _read)
    layouts.decode(_request(_values(1)))
    data = _request(_values(2), **other)
    decoded = layouts.decode(data)
    assert layouts.hits == 0
    _same(decoded, _slow(data))


def test_a_field_after_the_raw_contents_is_never_folded_into_a_layout() -> None:
    layouts = RequestLayouts(MAX_ELEMENTS, _read)
    renamed = _request(_values(1)) + pb.ModelInferRequest(model_name="other").SerializeToString()
    assert layouts.decode(renamed).request.model == "other"  # protobuf: the last model_name wins
    plain = _request(_values(2))
    assert layouts.decode(plain).request.model == "tiny_mlp"
    assert layouts.hits == 0
    assert layouts.decode(renamed).request.model == "other"  # a layout exists for the prefix now: not used
    assert layouts.hits == 0


@pytest.mark.parametrize("count", [63, 65])
def test_a_raw_entry_of_another_length_gets_the_parsers_error(count: int) -> None:
    layouts = RequestLayouts(MAX_ELEMENTS, _read)
    layouts.decode(_request(_values(1)))
    with pytest.raises(InvalidInput, match=f"binary_data_size is {count * 4} bytes, expected 256"):
        layouts.decode(_request(_values(2, count)))
    assert layouts.hits == 0


def test_a_truncated_or_malformed_message_is_refused_as_the_parser_refuses_it() -> None:
    layouts = RequestLayouts(MAX_ELEMENTS, _read)
    data = _request(_values(1))
    layouts.decode(data)
    with pytest.raises(InvalidInput, match="not a valid ModelInferRequest"):
        layouts.decode(data[:-10])
    assert layouts.hits == 0


def test_typed_contents_are_never_cached() -> None:
    layouts = RequestLayouts(MAX_ELEMENTS, _read)
    message = pb.ModelInferRequest(model_name="tiny_mlp")
    message.inputs.add(name="input", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    for _ in range(2):
        assert layouts.decode(message.SerializeToString()).request.inputs["input"].tolist() == [[1.0, 2.0]]
    assert layouts.hits == 0


def test_a_client_alternating_layouts_gets_each_right_and_the_cache_stays_bounded() -> None:
    layouts = RequestLayouts(MAX_ELEMENTS, _read)
    for _ in range(3):
        for n in range(_ENTRIES + 8):
            data = _request(_values(n), model=f"m{n}")
            decoded = layouts.decode(data)
            assert decoded.request.model == f"m{n}"
            _same(decoded, _slow(data))
            assert len(layouts._cache) <= _ENTRIES


def _response(outputs: dict[str, np.ndarray[Any, Any]], id_: str = "") -> InferResponse:
    return InferResponse("tiny_mlp", "1", outputs, id_)


@pytest.mark.parametrize("outputs", [
    {"output": np.arange(10, dtype=np.float32).reshape(1, 10)},
    {"a": np.arange(6, dtype=">i4").reshape(2, 3), "b": np.array([True, False])},  # big-endian: converted
    {"text": np.array([b"ab", b"c"], dtype=object), "n": np.zeros((0, 4), np.float16)},
    {"t": np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))},  # row-major on the wire
])
def test_a_response_parses_to_the_message_encode_infer_builds(outputs: dict[str, np.ndarray[Any, Any]]) -> None:
    layouts = ResponseLayouts()
    specs = tuple(OutputSpec(name, None) for name in outputs)
    for _ in range(2):
        fast = pb.ModelInferResponse.FromString(layouts.encode(_response(outputs, "x"), specs, _write))
        assert fast == encode_infer(_response(outputs, "x"), specs, _write)
    assert layouts.hits == 1


def test_a_response_of_another_shape_or_dtype_gets_its_own_prefix() -> None:
    layouts = ResponseLayouts()
    specs = (OutputSpec("output", None),)
    layouts.encode(_response({"output": np.zeros((1, 10), np.float32)}), specs, _write)
    for other in (_response({"output": np.zeros((2, 5), np.float32)}),
                  _response({"output": np.zeros((1, 10), np.int32)})):
        encoded = pb.ModelInferResponse.FromString(layouts.encode(other, specs, _write))
        assert encoded == encode_infer(other, specs, _write)
    assert layouts.hits == 0


def test_responses_differing_only_in_id_share_a_prefix_and_each_carries_its_own_id() -> None:
    layouts = ResponseLayouts()
    specs = (OutputSpec("output", None),)
    for request_id in ("", "1", "id-2", "\u00e9t\u00e9", "x" * 200):  # 200: a two-byte length
        result = _response({"output": np.arange(10, dtype=np.float32).reshape(1, 10)}, request_id)
        data = layouts.encode(result, specs, _write)
        assert pb.ModelInferResponse.FromString(data) == encode_infer(result, specs, _write)
        assert data == encode_infer(result, specs, _write).SerializeToString()
    assert layouts.hits == 4 and len(layouts._cache) == 1


def test_a_long_request_id_is_answered_and_kept_out_of_the_layout() -> None:
    layouts = ResponseLayouts()
    specs = (OutputSpec("output", None),)
    for n in range(3):
        long_id = f"{n}" * (_PREFIX_BYTES + 1)
        result = _response({"output": np.zeros((1, 10), np.float32)}, long_id)
        assert pb.ModelInferResponse.FromString(layouts.encode(result, specs, _write)).id == long_id
    assert len(layouts._cache) == 1 and layouts.hits == 2


def _with_id(values: np.ndarray[Any, Any], *ids: bytes) -> bytes:
    """A request whose id fields hold ``ids`` as given (protobuf's serialiser would refuse bad UTF-8 or two)."""
    data = _request(values)
    model = pb.ModelInferRequest(model_name="tiny_mlp").SerializeToString()
    fields = b"".join(b"\x1a" + bytes((len(request_id),)) + request_id for request_id in ids)
    return model + fields + data[len(model):]


def test_requests_differing_only_in_id_share_a_layout_and_each_gets_its_own_id() -> None:
    layouts = RequestLayouts(MAX_ELEMENTS, _read)
    for n, request_id in enumerate((b"", b"1", b"22", b"1", b"\xc3\xa9")):
        data = _with_id(_values(n), request_id)
        decoded = layouts.decode(data)
        _same(decoded, _slow(data))
        assert decoded.request.id == request_id.decode()
    assert layouts.hits == 4 and len(layouts._cache) == 1


def test_an_id_that_is_not_utf8_goes_to_the_parser_which_refuses_it() -> None:
    layouts = RequestLayouts(MAX_ELEMENTS, _read)
    layouts.decode(_with_id(_values(0), b"1"))
    with pytest.raises(InvalidInput, match="not a valid ModelInferRequest"):
        layouts.decode(_with_id(_values(1), b"\xff"))
    assert layouts.hits == 0


def test_a_repeated_id_field_goes_to_the_parser_last_one_winning() -> None:
    layouts = RequestLayouts(MAX_ELEMENTS, _read)
    layouts.decode(_with_id(_values(0), b"1"))
    twice = _with_id(_values(1), b"a", b"b")
    decoded = layouts.decode(twice)
    assert decoded.request.id == "b" == _slow(twice).request.id
    assert layouts.hits == 0
