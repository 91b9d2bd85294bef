"""What a PyTorch model receives and returns, on real TorchScript modules on the CPU: inputs it may not write into
(shared memory, a request's body), outputs that are not what its config declares, and types torch cannot carry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest

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
