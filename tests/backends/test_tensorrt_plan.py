"""Binding discovery, profile selection, signatures and config checks over a fake engine (the hardware edge)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from edged.backends._trt_instance import check_input
from edged.backends._trt_plan import (
    Binding,
    ProfileRange,
    Shape,
    check_config,
    check_servable,
    discover_bindings,
    select_profile,
    signature,
)
from edged.errors import InvalidInput, ModelLoadError
from edged.repository.model_config import ModelConfig, TensorConfig


@dataclass
class FakeTensor:
    is_input: bool
    dtype: str
    shape: Shape
    profiles: list[tuple[Shape, Shape, Shape]] = field(default_factory=list)
    format: str = "LINEAR"


@dataclass
class FakeEngine:
    """Answers like trt.ICudaEngine would, through the EngineView protocol."""

    tensors: dict[str, FakeTensor]
    profiles: int = 1
    memory: int = 1000
    per_profile: tuple[int, ...] = ()

    def tensor_names(self) -> tuple[str, ...]:
        return tuple(self.tensors)

    def is_input(self, name: str) -> bool:
        return self.tensors[name].is_input

    def dtype_name(self, name: str) -> str:
        return self.tensors[name].dtype

    def shape(self, name: str) -> Shape:
        return self.tensors[name].shape

    def format_name(self, name: str) -> str:
        return self.tensors[name].format

    def format_desc(self, name: str) -> str:
        return "" if self.tensors[name].format == "LINEAR" else "Channel major FP16 format where C % 2 == 0"

    def is_shape_tensor(self, name: str) -> bool:
        return False

    def num_profiles(self) -> int:
        return self.profiles

    def profile_shapes(self, name: str, profile: int) -> tuple[Shape, Shape, Shape]:
        return self.tensors[name].profiles[profile]

    def device_memory_size(self) -> int:
        return self.memory

    def profile_device_memory_size(self, profile: int) -> int | None:
        return self.per_profile[profile] if self.per_profile else None


def detector(fmt: str = "LINEAR") -> FakeEngine:
    return FakeEngine(
        tensors={
            "images": FakeTensor(True, "FLOAT", (-1, 3, 640, 640), [
                ((1, 3, 640, 640), (1, 3, 640, 640), (1, 3, 640, 640)),
                ((2, 3, 640, 640), (8, 3, 640, 640), (16, 3, 640, 640)),
            ], format=fmt),
            "boxes": FakeTensor(False, "HALF", (-1, 100, 4)),
            "count": FakeTensor(False, "INT32", (-1,)),
        },
        profiles=2)


def test_discovery_reads_names_modes_types_and_profile_ranges() -> None:
    bindings = discover_bindings(detector())
    images, boxes, _count = bindings
    assert images.is_input and images.is_dynamic and images.triton_type == "TYPE_FP32"
    assert images.profiles[1] == ProfileRange((2, 3, 640, 640), (8, 3, 640, 640), (16, 3, 640, 640))
    assert not boxes.is_input and boxes.triton_type == "TYPE_FP16" and boxes.profiles == ()


def test_signature_gives_shapes_with_minus_one_and_first_profile_max_batch() -> None:
    sig = signature(discover_bindings(detector()))
    assert [(t.name, t.data_type, t.shape) for t in sig.inputs] == [("images", "TYPE_FP32", (-1, 3, 640, 640))]
    assert [t.name for t in sig.outputs] == ["boxes", "count"]
    assert sig.max_batch_hint == 1  # profile 0's max, not the largest profile's
    assert sig.notes == ()


def test_static_first_dimension_gives_no_batch_hint() -> None:
    engine = FakeEngine({"x": FakeTensor(True, "FLOAT", (1, 4), [((1, 4), (1, 4), (1, 4))]),
                         "y": FakeTensor(False, "FLOAT", (1, 2))})
    assert signature(discover_bindings(engine)).max_batch_hint is None


def test_non_linear_io_is_noted_for_autocomplete_and_refused_at_load() -> None:
    bindings = discover_bindings(detector(fmt="CHW2"))
    (note,) = signature(bindings).notes
    assert "'images'" in note and "CHW2" in note and "LINEAR" in note
    with pytest.raises(ModelLoadError, match=r"model 'det'.*input 'images' uses TensorRT format CHW2"):
        check_servable("det", bindings)


def test_unsupported_io_dtype_is_refused_at_load() -> None:
    engine = FakeEngine({"x": FakeTensor(True, "FLOAT", (1, 4), [((1, 4), (1, 4), (1, 4))]),
                         "y": FakeTensor(False, "BF16", (1, 4))})
    with pytest.raises(ModelLoadError, match="output 'y' has type BF16"):
        check_servable("m", discover_bindings(engine))


def test_profile_selection_keeps_current_profile_when_it_fits() -> None:
    bindings = discover_bindings(detector())
    assert select_profile(bindings, {"images": (1, 3, 640, 640)}) == 0
    assert select_profile(bindings, {"images": (8, 3, 640, 640)}) == 1
    assert select_profile(bindings, {"images": (2, 3, 640, 640)}, current=1) == 1


def test_profile_selection_names_every_range_when_none_fits() -> None:
    bindings = discover_bindings(detector())
    with pytest.raises(InvalidInput, match=r"images \[32, 3, 640, 640\].*profile 1: images min \[2, 3, 640, 640\] "
                                           r"max \[16, 3, 640, 640\]"):
        select_profile(bindings, {"images": (32, 3, 640, 640)})


def test_profile_selection_needs_every_input() -> None:
    with pytest.raises(InvalidInput, match="missing input"):
        select_profile(discover_bindings(detector()), {})


def config(**kwargs: object) -> ModelConfig:
    base: dict[str, object] = {
        "name": "det", "backend": "tensorrt", "max_batch_size": 16,
        "input": (TensorConfig("images", "TYPE_FP32", (3, 640, 640)),),
        "output": (TensorConfig("boxes", "TYPE_FP16", (100, 4)), TensorConfig("count", "TYPE_INT32", ())),
    }
    base.update(kwargs)
    return ModelConfig(**base)  # type: ignore[arg-type]


def test_matching_config_passes() -> None:
    check_config(config(), discover_bindings(detector()))


def test_config_mismatches_are_listed_with_expected_and_found() -> None:
    bad = config(input=(TensorConfig("image", "TYPE_FP32", (3, 640, 640)),),
                 output=(TensorConfig("boxes", "TYPE_FP32", (100, 5)),))
    with pytest.raises(ModelLoadError) as info:
        check_config(bad, discover_bindings(detector()))
    text = str(info.value)
    assert "input 'image' is not an engine input (engine has ['images'])" in text
    assert "output 'boxes': config says TYPE_FP32, engine has TYPE_FP16" in text
    assert "config dims [-1, 100, 5] (with batch) do not fit engine shape [-1, 100, 4]" in text


def test_max_batch_size_beyond_every_profile_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="max_batch_size 32 exceeds the largest batch 16"):
        check_config(config(max_batch_size=32), discover_bindings(detector()))


def test_input_arrays_are_checked_for_dtype_and_rank() -> None:
    images = discover_bindings(detector())[0]
    with pytest.raises(InvalidInput, match="expected dtype float32, found float64"):
        check_input(images, np.zeros((1, 3, 640, 640)))
    with pytest.raises(InvalidInput, match="expected 4 dimensions"):
        check_input(images, np.zeros((3, 640, 640), np.float32))
    fixed = Binding("x", True, "INT32", (2, 2), "LINEAR")
    with pytest.raises(InvalidInput, match=r"expected shape \[2, 2\], found \[2, 3\]"):
        check_input(fixed, np.zeros((2, 3), np.int32))
    out = check_input(fixed, np.zeros((2, 2), np.int32).T)
    assert out.flags.c_contiguous
