"""Payload codecs without a broker: image preprocessing, raw tensors, top-k labels, codec choice."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from edged.errors import PayloadError
from edged.mqtt._codecs import codec_for, decode, reply_topic_in, top_k
from edged.mqtt._image import decode_image, image_spec
from edged.mqtt._message import Inbound
from edged.mqtt._topics import filter_matches
from edged.repository.model_config import ModelConfig, TensorConfig


def rgb_model(**parameters: str) -> ModelConfig:
    return ModelConfig(name="cls", max_batch_size=8, parameters=parameters,
                       input=(TensorConfig("images", "TYPE_FP32", (3, 4, 6)),),
                       output=(TensorConfig("logits", "TYPE_FP32", (5,)),))


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def test_image_nchw_with_mean_and_std_per_channel() -> None:
    spec = image_spec(rgb_model(image_mean="0.5,0.5,0.5", image_std="0.25,0.5,1"))
    assert (spec.layout, spec.width, spec.height, spec.color) == ("CHW", 6, 4, "rgb")
    pixels = np.zeros((8, 12, 3), np.uint8)
    pixels[..., 0] = 255  # pure red, resized from 12x8 to 6x4
    tensor = decode_image(png(pixels), spec)
    assert tensor.shape == (1, 3, 4, 6) and tensor.dtype == np.float32
    np.testing.assert_allclose(tensor[0, :, 0, 0], [(1 - 0.5) / 0.25, (0 - 0.5) / 0.5, (0 - 0.5) / 1], atol=1e-6)


def test_image_nhwc_bgr_and_scale_parameters() -> None:
    config = ModelConfig(name="m", max_batch_size=0, parameters={"image_color": "bgr", "image_scale": "1"},
                         input=(TensorConfig("x", "TYPE_FP32", (1, 2, 2, 3)),))
    spec = image_spec(config)
    pixels = np.zeros((2, 2, 3), np.uint8)
    pixels[..., 0] = 200
    tensor = decode_image(png(pixels), spec)
    assert spec.layout == "NHWC" and tensor.shape == (1, 2, 2, 3)
    assert tensor[0, 0, 0].tolist() == [0, 0, 200]


@pytest.mark.parametrize("payload", [b"", b"GIF89a-not-really", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40])
def test_unreadable_images_are_payload_errors(payload: bytes) -> None:
    with pytest.raises(PayloadError, match="not a readable image"):
        decode_image(payload, image_spec(rgb_model()))


def test_image_parameters_are_checked() -> None:
    with pytest.raises(PayloadError, match="image_layout"):
        image_spec(rgb_model(image_layout="XYZ"))
    with pytest.raises(PayloadError, match="image_size"):
        image_spec(rgb_model(image_size="big"))
    with pytest.raises(PayloadError, match="image_std"):
        image_spec(rgb_model(image_std="0"))


def test_raw_tensor_size_must_match_shape() -> None:
    message = Inbound("t", b"\x00" * 10, 1, user_properties=(("datatype", "FP32"), ("shape", "1,3")))
    with pytest.raises(PayloadError, match="expected 12"):
        decode(message, "raw", rgb_model(), None, 1 << 20)
    message = Inbound("t", b"\x00" * 12, 1, user_properties=(("datatype", "FP32"), ("shape", "1,-3")))
    with pytest.raises(PayloadError, match="shape"):
        decode(message, "raw", rgb_model(), None, 1 << 20)


def test_codec_from_v5_content_type() -> None:
    assert codec_for(Inbound("t", b"", 1, content_type="image/jpeg"), "json") == "image"
    assert codec_for(Inbound("t", b"", 1, content_type="application/octet-stream",
                             user_properties=(("Inference-Header-Content-Length", "10"),)), "json") == "binary"
    assert codec_for(Inbound("t", b"", 1, content_type="application/octet-stream"), "json") == "raw"
    assert codec_for(Inbound("t", b"", 1), "image") == "image"


def test_top_k_uses_labels_triton_format() -> None:
    scores = np.array([[0.1, 0.7, 0.2]], np.float32)
    result = top_k({"p": scores}, {"p": ["cat", "dog", "cow"]}, 2)["p"]
    assert result.shape == (1, 2)
    assert [v.decode() for v in result.ravel()] == ["0.700000:1:dog", "0.200000:2:cow"]


@given(st.lists(st.text(alphabet="ab+#/$", max_size=4), min_size=1, max_size=5))
def test_filter_matching_never_raises_and_plus_captures_single_levels(levels: list[str]) -> None:
    topic = "/".join(levels)
    captures = filter_matches("+/+", topic)
    if captures is not None:
        assert all("/" not in c for c in captures) and "/".join(captures) == topic


def test_the_reply_to_of_a_json_request_holding_nan_is_found() -> None:
    # the request's own JSON takes NaN and ±Infinity as the socket API does (Triton's JSON): so does its reply_to
    payload = (b'{"reply_to": "results/r1", "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 2], '
               b'"data": [NaN, -Infinity]}]}')
    assert reply_topic_in(Inbound("t", payload, 1)) == "results/r1"
