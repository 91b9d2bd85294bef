"""The seam between the engine and the runtimes: the `Backend` and `ModelInstance` protocols.

A backend turns a model file plus its ModelConfig into instances that run batches of named numpy arrays.
Backends never see requests, queues or transports; the engine never imports a runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy.typing as npt

from edged.repository.model_config import ModelConfig, ModelSignature

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class InstanceInfo:
    """What a loaded instance reports about itself (metadata, metrics, doctor)."""

    device: str = "cpu"  # "cpu", "cuda:0", ...
    providers: tuple[str, ...] = ()  # e.g. ONNX Runtime execution providers in use
    fallback: str | None = None  # set when the config allowed a fallback and it happened: the reason
    details: dict[str, Any] = field(default_factory=dict)


class ModelInstance(Protocol):
    info: InstanceInfo

    def run(self, inputs: Mapping[str, Array], output_names: Sequence[str]) -> dict[str, Array]:
        """Run one (possibly batched) execution; inputs and outputs are named as in the config."""
        ...

    def release_memory(self) -> None:
        """Give cached memory back after a run of unusual size (arena shrinkage); cheap no-op otherwise."""
        ...

    def close(self) -> None:
        """Drop every reference to runtime objects so their memory can be freed."""
        ...


class Backend(Protocol):
    name: str

    def describe(self, model_path: Path) -> ModelSignature:
        """Read inputs and outputs from the model file (for auto-complete); raise ModelLoadError."""
        ...

    def load(self, model_path: Path, config: ModelConfig, instance_index: int) -> ModelInstance:
        """Load one instance; raise ModelLoadError (BackendUnavailable if the runtime is missing)."""
        ...

    def runtime_info(self) -> dict[str, Any]:
        """Versions and capabilities (providers, CUDA) for doctor and server metadata."""
        ...

    def available_gpus(self) -> tuple[int, ...]:
        """The GPU ids this runtime can use here; instance groups of KIND_AUTO become KIND_GPU on them, as
        in Triton. Empty on a CPU-only runtime or machine."""
        ...

