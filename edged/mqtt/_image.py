"""Images (JPEG, PNG, anything Pillow reads) to input tensors, with the preprocessing the model declares.

The model's config.pbtxt declares it through ``parameters`` (all optional; defaults come from the input's dims):

- ``image_input``: the input to fill (default: the model's only input)
- ``image_size``: "WxH" to resize to (default: from dims; required for a flat input)
- ``image_layout``: NCHW | NHWC | CHW | HWC | HW | FLAT (default: from dims; the batch dimension is added
  when max_batch_size > 0)
- ``image_color``: gray | rgb | bgr (default: from the channel count)
- ``image_scale``: multiplier applied to 0..255 pixels (default 1/255), then
- ``image_mean`` / ``image_std``: one number or one per channel, comma-separated: (x * scale - mean) / std
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.errors import PayloadError, PayloadTooLarge
from edged.repository.model_config import ModelConfig, TensorConfig

LAYOUTS = ("NCHW", "NHWC", "CHW", "HWC", "HW", "FLAT")
MAX_PIXELS = 64 * 1024 * 1024
_NUMPY = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "UINT8": np.uint8, "INT8": np.int8}


@dataclass(frozen=True)
class ImageSpec:
    input: str
    width: int
    height: int
    layout: str
    color: str
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    batched: bool
    datatype: str


def image_spec(config: ModelConfig, input_name: str | None = None) -> ImageSpec:
    params = config.parameters
    tensor = _input(config, input_name or params.get("image_input"))
    dims = tuple(tensor.dims)
    layout = params.get("image_layout", "").upper() or _layout_from(dims, config.name)
    if layout not in LAYOUTS:
        raise PayloadError(f"model {config.name}: image_layout {layout!r}, expected one of {', '.join(LAYOUTS)}")
    channels = _channels(dims, layout)
    color = params.get("image_color", "").lower() or ("gray" if channels == 1 else "rgb")
    if color not in ("gray", "rgb", "bgr"):
        raise PayloadError(f"model {config.name}: image_color {color!r}, expected gray, rgb or bgr")
    width, height = _size(params.get("image_size"), dims, layout, config.name)
    if tensor.datatype not in _NUMPY:
        raise PayloadError(f"model {config.name}: input {tensor.name} is {tensor.datatype}; images need "
                           f"one of {', '.join(_NUMPY)}")
    return ImageSpec(tensor.name, width, height, layout, color, _float(params, "image_scale", 1 / 255),
                     _floats(params, "image_mean", 0.0), _floats(params, "image_std", 1.0),
                     config.max_batch_size > 0, tensor.datatype)


def decode_image(payload: bytes, spec: ImageSpec) -> np.ndarray[Any, Any]:
    try:
        from PIL import Image, UnidentifiedImageError  # optional dependency, only for image payloads
    except ImportError as e:
        raise PayloadError("image payloads need Pillow, which is not installed (pip install 'edged[image]')") \
            from e

    try:
        with Image.open(io.BytesIO(payload)) as image:
            if image.width * image.height > MAX_PIXELS:
                raise PayloadTooLarge(f"image is {image.width}x{image.height}, more than {MAX_PIXELS} pixels")
            image = image.convert("L" if spec.color == "gray" else "RGB")
            if image.size != (spec.width, spec.height):
                image = image.resize((spec.width, spec.height), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.float32)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise PayloadError(f"payload is not a readable image: {e}") from None
    if spec.color == "bgr":
        pixels = pixels[..., ::-1]
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    mean = np.asarray(spec.mean, np.float32)
    std = np.asarray(spec.std, np.float32)
    scaled: np.ndarray[Any, Any] = (pixels * np.float32(spec.scale) - mean) / std
    return _arrange(scaled, spec).astype(_NUMPY[spec.datatype])


def _arrange(hwc: np.ndarray[Any, Any], spec: ImageSpec) -> np.ndarray[Any, Any]:
    if spec.layout in ("NCHW", "CHW"):
        out = hwc.transpose(2, 0, 1)
    elif spec.layout == "HW":
        out = hwc[..., 0]
    elif spec.layout == "FLAT":
        out = hwc.reshape(-1)
    else:
        out = hwc
    if spec.layout.startswith("N") or spec.batched:
        out = out[None, ...]
    return np.ascontiguousarray(out)


def _input(config: ModelConfig, name: str | None) -> TensorConfig:
    if name is None:
        if len(config.input) != 1:
            raise PayloadError(f"model {config.name} has {len(config.input)} inputs; set image_input")
        return config.input[0]
    tensor = config.input_named(name)
    if tensor is None:
        raise PayloadError(f"model {config.name} has no input {name!r}")
    return tensor


def _layout_from(dims: tuple[int, ...], model: str) -> str:
    if len(dims) == 3:
        return "CHW" if dims[0] in (1, 3) else "HWC"
    if len(dims) == 4:
        return "NCHW" if dims[1] in (1, 3) else "NHWC"
    if len(dims) == 2:
        return "HW"
    if len(dims) == 1:
        return "FLAT"
    raise PayloadError(f"model {model}: cannot infer an image layout from dims {list(dims)}; set image_layout")


def _channels(dims: tuple[int, ...], layout: str) -> int:
    position = {"NCHW": 1, "NHWC": 3, "CHW": 0, "HWC": 2}.get(layout)
    if position is None or position >= len(dims):
        return 1
    return dims[position] if dims[position] > 0 else 3


def _size(text: str | None, dims: tuple[int, ...], layout: str, model: str) -> tuple[int, int]:
    if text:
        width, _, height = text.lower().partition("x")
        if width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0:
            return int(width), int(height)
        raise PayloadError(f"model {model}: image_size {text!r}, expected WxH such as 224x224")
    axes = {"NCHW": (3, 2), "NHWC": (2, 1), "CHW": (2, 1), "HWC": (1, 0), "HW": (1, 0)}.get(layout)
    if axes is None or max(axes) >= len(dims) or dims[axes[0]] <= 0 or dims[axes[1]] <= 0:
        raise PayloadError(f"model {model}: cannot infer the image size from dims {list(dims)}; set image_size")
    return dims[axes[0]], dims[axes[1]]


def _float(params: dict[str, str], key: str, default: float) -> float:
    return _floats(params, key, default)[0]


def _floats(params: dict[str, str], key: str, default: float) -> tuple[float, ...]:
    text = params.get(key)
    if not text:
        return (default,)
    try:
        values = tuple(float(eval_fraction(v)) for v in text.split(","))
    except ValueError:
        raise PayloadError(f"model parameter {key}: expected numbers separated by commas, found {text!r}") \
            from None
    if key == "image_std" and any(v == 0 for v in values):
        raise PayloadError(f"model parameter image_std must not be 0, found {text!r}")
    return values


def eval_fraction(text: str) -> float:
    """A number or a fraction such as 1/255."""
    numerator, slash, denominator = text.strip().partition("/")
    return float(numerator) / float(denominator) if slash else float(numerator)
