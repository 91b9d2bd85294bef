"""A model's config made complete before its versions load: auto-completed from files that describe
themselves (ONNX, TensorRT), which also checks the config against the file; other runtimes need a config that
lists every input and output."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from edged.backends import Backend
from edged.errors import ModelConfigError, ModelLoadError
from edged.repository import autocomplete, confined_path, normalize
from edged.repository.model_config import ModelConfig

# Runtimes whose model files carry their inputs and outputs, so a config is completed and checked from them.
SELF_DESCRIBING = frozenset({"onnxruntime", "tensorrt"})


def complete_config(name: str, config: ModelConfig | None, runtime: str, backend: Backend, model_dir: Path,
                    available: list[int], autocomplete_on: bool) -> ModelConfig:
    """Auto-complete from the model file where the format describes itself (ONNX, TensorRT), which also
    checks the config against the file; other runtimes need a config that lists inputs and outputs."""
    complete = config is not None and bool(config.input) and bool(config.output)
    if not autocomplete_on and not complete:
        raise ModelLoadError(f"model {name}: auto-complete is off ([models] autocomplete = false) and the "
                             "config.pbtxt does not list every input and output")
    if (runtime not in SELF_DESCRIBING or not autocomplete_on) and config is not None and complete:
        config = config if config.name else dataclasses.replace(config, name=name)
        return normalize(_with_export_file(config, runtime, model_dir, available), _gpus(backend))
    if runtime == "pytorch":
        raise ModelLoadError(f"model {name}: PyTorch models need a config.pbtxt listing every input and "
                             "output (name, data_type, dims)")
    if not available:
        raise ModelLoadError(f"model {name}: no numbered version folder in {model_dir}")
    probe = ModelConfig(name=name, backend=runtime) if config is None else config
    path = confined_path(model_dir, probe.model_filename, "default_model_filename", under=str(max(available)),
                         must_exist=False)
    return autocomplete(config, name, backend.describe(path), runtime, gpus=_gpus(backend))


def _gpus(backend: Backend) -> tuple[int, ...]:
    """The GPUs the backend can use; custom backends without the method are CPU-only."""
    probe = getattr(backend, "available_gpus", None)
    return tuple(probe()) if callable(probe) else ()


def _with_export_file(config: ModelConfig, runtime: str, model_dir: Path, available: list[int]) -> ModelConfig:
    """A PyTorch model folder holding a torch.export program (model.pt2) and no TorchScript file uses it."""
    if runtime != "pytorch" or config.default_model_filename or not available:
        return config
    latest = model_dir / str(max(available))
    if not (latest / "model.pt").exists() and (latest / "model.pt2").exists():
        return dataclasses.replace(config, default_model_filename="model.pt2")
    return config



def check_instance_count(config: ModelConfig, limit: int) -> None:
    """Refuse a config whose instance groups ask for more instances than ``[models] max_instance_count``: every
    instance is a copy of the model of its own (a session, an engine), so a count of thousands exhausts the
    device's memory and holds the registry for minutes. A config error (HTTP 400): the config asks for it."""
    count = config.instance_count
    if count > limit:
        raise ModelConfigError(f"model {config.name}: instance_group count asks for {count} instances (summed over "
                               f"its instance groups), more than the limit of {limit} per model version ([models] "
                               "max_instance_count); lower instance_group count or raise [models] max_instance_count")
