"""Runtimes behind one `Backend` protocol, chosen by name and imported only when chosen.

Like uvicorn's name → "module:Class" tables: importing this package imports no runtime, so the daemon starts
without onnxruntime, torch or TensorRT installed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from edged.backends.base import Backend, InstanceInfo, ModelInstance
from edged.backends.generative import GenerativeInstance, Sampling, Token
from edged.errors import BackendUnavailable, UnknownBackend

__all__ = ["BACKENDS", "Backend", "GenerativeInstance", "InstanceInfo", "ModelInstance", "Sampling", "Token",
           "load_backend"]

BACKENDS: dict[str, str] = {
    "onnxruntime": "edged.backends.onnxruntime:OnnxRuntimeBackend",
    "pytorch": "edged.backends.pytorch:PyTorchBackend",
    "tensorrt": "edged.backends.tensorrt:TensorRTBackend",
    "onnxruntime_genai": "edged.backends.genai:GenAIBackend",
}


def load_backend(name: str, extra: Mapping[str, str] | None = None) -> Backend:
    """Instantiate the backend called ``name`` (a Triton backend name such as "onnxruntime").

    ``extra`` maps further names to "module:Class" (the ``[models] backends`` config table).
    """
    table = {**BACKENDS, **(extra or {})}
    target = table.get(name)
    if target is None:
        known = ", ".join(sorted(table))
        raise UnknownBackend(f"unknown backend {name!r}: edged supports {known}", name, tuple(sorted(table)))
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        backend: Backend = getattr(module, class_name)()
    except (ImportError, AttributeError) as e:
        raise BackendUnavailable(f"backend {name!r} ({target}) cannot be loaded: {e}") from e
    return backend
