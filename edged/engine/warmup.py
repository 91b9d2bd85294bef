"""Warm-up inputs: from the config's ``model_warmup`` entries, or generated from the input specs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from edged.engine.types import Array
from edged.errors import ModelLoadError
from edged.repository.confine import read_confined, warmup_shape
from edged.repository.datatypes import TRITON_TO_NUMPY
from edged.repository.model_config import ModelConfig, WarmupInput

log = logging.getLogger(__name__)


def warmup_samples(config: ModelConfig, model_dir: Path,
                   max_elements: int | None = None) -> Iterator[tuple[dict[str, Array], int]]:
    """(inputs, repeat count) pairs to run before a version is ready, each made when it is reached (one sample's
    memory at a time: eight 64 MiB samples made at once took 512 MiB); none when inputs cannot be made up, or
    when a made-up input would hold more than ``max_elements``: no request could be that large (a model declaring
    dims of 2**40 failed its load allocating 4 TiB; a few GiB would have been allocated and run)."""
    if config.model_warmup:  # as Triton: a sample of batch_size 0 (unset) is skipped, count 0 runs once
        for entry in config.model_warmup:
            if entry.batch_size > 0:
                yield _from_entry(config, entry.inputs, entry.batch_size, model_dir), max(1, entry.count)
        return
    generated: dict[str, Array] = {}
    for spec in config.input:
        if spec.data_type not in TRITON_TO_NUMPY or spec.data_type == "TYPE_STRING" or spec.optional:
            return  # no safe made-up value (strings, optional inputs): skip generated warm-up
        dims = [1 if d < 0 else d for d in spec.dims]
        shape = [1, *dims] if config.max_batch_size > 0 else dims
        if max_elements is not None and prod(shape) > max_elements:
            log.info("model %s: no warm-up generated: input %s of shape %s would hold more than %d elements "
                     "([server] max_tensor_elements)", config.name, spec.name, shape, max_elements)
            return
        generated[spec.name] = np.zeros(shape, dtype=TRITON_TO_NUMPY[spec.data_type])
    if generated:
        yield generated, 1


def _from_entry(config: ModelConfig, inputs: dict[str, WarmupInput], batch_size: int,
                model_dir: Path) -> dict[str, Array]:
    arrays: dict[str, Array] = {}
    rng = np.random.default_rng(0)
    for name, spec in inputs.items():
        dtype = TRITON_TO_NUMPY.get(spec.data_type)
        if dtype is None:
            raise ModelLoadError(f"model {config.name}: warm-up input {name!r} has unsupported type {spec.data_type}")
        shape = warmup_shape(config, batch_size, spec)
        arrays[name] = _warmup_array(config, name, spec, shape, dtype, rng, model_dir)
    return arrays


def _warmup_array(config: ModelConfig, name: str, spec: WarmupInput, shape: list[int], dtype: Any,
                  rng: np.random.Generator, model_dir: Path) -> Array:
    if spec.source == "zero_data":
        return np.zeros(shape, dtype=dtype)
    if spec.source == "random_data":
        # made in the tensor's own type where numpy can: a float64 or int64 draw converted after held twice the memory
        if dtype in (np.float32, np.float64):
            return rng.random(shape, dtype=dtype)
        if dtype.kind == "f":
            return rng.random(shape, dtype=np.float32).astype(dtype)
        if dtype.kind in "iu":
            return rng.integers(0, 2, size=shape, dtype=dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, size=shape, dtype=np.uint8).astype(dtype)
        return np.zeros(shape, dtype=dtype)
    path = model_dir / "warmup" / spec.input_data_file  # Triton's location for input_data_file
    count = int(np.prod(shape))
    # only what the tensor takes: a file of 100 MB for a 256-byte input was read whole, then cut
    raw = read_confined(model_dir, spec.input_data_file,
                        f"model {config.name}: input_data_file of warm-up input {name!r}", under="warmup",
                        at_most=count * dtype.itemsize)
    data = np.frombuffer(raw, dtype=dtype)
    if data.size < count:
        raise ModelLoadError(f"model {config.name}: warm-up file {path} holds {data.size} elements, expected "
                             f"{count} for shape {shape}")
    result: Array = data[:count].reshape(shape).copy()
    return result
