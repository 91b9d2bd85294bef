"""What a PyTorch model receives and returns, on real TorchScript modules on the CPU: inputs it may not write into
(shared memory, a request's body), outputs that are not what its config declares, and types torch cannot carry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest
from edged.errors import InvalidInput

CONFIG = """name: "{name}"
backend: "pytorch"
max_batch_size: 8
input [ {{ name: "INPUT__0", data_type: {in_type}, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT__0", data_type: {out_type}, dims: [ 4 ] }}{more} ]
"""


class InPlace(torch.nn.Module):
    """Normalises its input in place, as traced preprocessing often does (x /= 255)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return x


class Doubles(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


class Nested(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        return x, (x, x)


class Brain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)


def _add(repo: Path, name: str, module: torch.nn.Module, in_type: str = "TYPE_FP32", out_type: str = "TYPE_FP32",
         more: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    torch.jit.script(module).save(str(repo / name / "1" / "model.pt"))
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, in_type=in_type, out_type=out_type,
                                                            more=more))


def _reason(service: InferenceService, name: str) -> str:
    return next(str(entry["reason"]) for entry in service.repository_index() if entry["name"] == name)


def test_a_model_writing_into_its_input_leaves_a_read_only_input_as_it_was(tmp_path: Path) -> None:
    _add(tmp_path, "inplace", InPlace())
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        # the read-only view edged hands a model for a tensor in a client's shared-memory region or a request body
        region = bytearray(np.ones((1, 4), np.float32).tobytes())
        frame = np.frombuffer(memoryview(region).toreadonly(), np.float32).reshape(1, 4)
        out = service.infer(InferRequest("inplace", {"INPUT__0": frame})).outputs["OUTPUT__0"]
        assert out.tolist() == [[2.0] * 4]
        assert np.frombuffer(region, np.float32).tolist() == [1.0] * 4
    finally:
        service.close()


def test_outputs_the_config_does_not_describe_fail_the_load_naming_the_output(tmp_path: Path) -> None:
    _add(tmp_path, "doubles", Doubles())
    _add(tmp_path, "nested", Nested(), more=', { name: "OUTPUT__1", data_type: TYPE_FP32, dims: [ 4 ] }')
    _add(tmp_path, "brain", Brain(), out_type="TYPE_FP16")
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        assert not any(service.model_ready(name) for name in ("doubles", "nested", "brain"))
        assert "output 'OUTPUT__0' as float64 (TYPE_FP64), but the config declares TYPE_FP32" in _reason(
            service, "doubles")
        assert "a tuple for output 'OUTPUT__1', not a tensor" in _reason(service, "nested")
        assert "output 'OUTPUT__0' as bfloat16" in _reason(service, "brain")
    finally:
        service.close()


def test_string_tensors_are_refused_at_load_naming_the_input(tmp_path: Path) -> None:
    _add(tmp_path, "words", InPlace(), in_type="TYPE_STRING")
    _add(tmp_path, "answers", InPlace(), out_type="TYPE_STRING")
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        assert not service.model_ready("words") and not service.model_ready("answers")
        assert "input 'INPUT__0' is TYPE_STRING" in _reason(service, "words")
        assert "output 'OUTPUT__0' is TYPE_STRING" in _reason(service, "answers")
    finally:
        service.close()


def test_an_input_outside_an_exported_programs_dynamic_range_is_invalid_input(tmp_path: Path) -> None:
    (tmp_path / "ranged" / "1").mkdir(parents=True)
    width = torch.export.Dim("width", min=2, max=16)
    program = torch.export.export(Doubles(), (torch.ones(2, 4),), dynamic_shapes={"x": {1: width}})
    torch.export.save(program, str(tmp_path / "ranged" / "1" / "model.pt2"))
    (tmp_path / "ranged" / "config.pbtxt").write_text("""name: "ranged"
platform: "torch_export"
max_batch_size: 0
input [ { name: "INPUT__0", data_type: TYPE_FP32, dims: [ 2, -1 ] } ]
output [ { name: "OUTPUT__0", data_type: TYPE_FP64, dims: [ 2, -1 ] } ]
""")
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        assert service.infer(InferRequest("ranged", {"INPUT__0": np.ones((2, 8), np.float32)})).outputs[
            "OUTPUT__0"].shape == (2, 8)
        with pytest.raises(InvalidInput, match=r"torch rejected the input: Guard failed: .* <= 16"):
            service.infer(InferRequest("ranged", {"INPUT__0": np.ones((2, 20), np.float32)}))
    finally:
        service.close()
