"""KServe v2 / Triton JSON documents describing models (metadata, repository index)."""

from __future__ import annotations

from typing import Any

from edged.engine.version import ModelVersion
from edged.repository.model_config import ModelConfig


def model_metadata(name: str, versions: list[ModelVersion], config: ModelConfig) -> dict[str, Any]:
    """KServe v2 model metadata: name, versions, platform, inputs and outputs with full shapes."""
    batch = [-1] if config.max_batch_size > 0 else []
    return {
        "name": name,
        "versions": [v.version_str for v in versions],
        "platform": config.platform or _platform_for(config.runtime),
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": batch + list(t.dims)} for t in config.input],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": batch + list(t.dims)}
                    for t in config.output],
    }


def _platform_for(runtime: str) -> str:
    return {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan",
            "pytorch": "pytorch_libtorch"}.get(runtime, runtime)
