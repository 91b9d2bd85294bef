"""A batch's rows: the requests' inputs concatenated into one execution, its outputs cut back per request.

Each request gets exactly its own rows, in the batch's order, and only the outputs it asked for (all of the
model's when it named none). A model whose outputs do not have one row per input row cannot be split: that is
an InferenceFailed for the batch, which the scheduler then runs request by request.
An output with a ``reshape`` in its config is reshaped from the backend's shape to the config's ``dims`` (the
batch dimension kept in front) before it is cut, as Triton does: every front end then carries the shape the
model's metadata advertises.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edged.engine.queue_policy import Pending
from edged.engine.types import Array, InferRequest, InferResponse
from edged.errors import InferenceFailed
from edged.repository.model_config import ModelConfig

# Per output with a reshape: (the backend's shape, the config's dims), both without the batch dimension.
OutputReshapes = dict[str, tuple[tuple[int, ...], tuple[int, ...]]]


def concatenate(batch: list[Pending]) -> dict[str, Any]:
    names = batch[0].inputs.keys()
    return {name: np.concatenate([item.inputs[name] for item in batch]) for name in names}


def check_rows(model: str, outputs: dict[str, Array], rows: int) -> None:
    """A batched model returns one output row per input row; anything else cannot be split by request."""
    for name, array in outputs.items():
        shape = getattr(array, "shape", ())
        if not shape or shape[0] != rows:
            raise InferenceFailed(f"model {model}: output {name!r} has shape {list(shape)} for a batch of {rows} "
                                  "rows; a model with dynamic batching must return one row per input row")


def output_reshapes(config: ModelConfig) -> OutputReshapes:
    return {t.name: (t.reshape.shape, t.dims) for t in config.output if t.reshape is not None}


def reshape_outputs(model: str, outputs: dict[str, Array], reshapes: OutputReshapes,
                    batching: bool) -> dict[str, Array]:
    """``outputs`` with each reshaped output in its config's ``dims``. As Triton: the backend's sizes at the
    ``-1`` positions of ``reshape.shape`` fill the ``-1`` positions of ``dims``, in order."""
    reshaped = dict(outputs)
    for name, (backend_shape, dims) in reshapes.items():
        array = reshaped.get(name)
        if array is None:
            continue
        lead = array.shape[:1] if batching else ()
        produced = array.shape[len(lead):]
        variable = iter([size for size, dim in zip(produced, backend_shape, strict=False) if dim == -1])
        target = (*lead, *[next(variable, -1) if dim == -1 else dim for dim in dims])
        try:
            reshaped[name] = array.reshape(target)
        except ValueError:
            raise InferenceFailed(f"model {model}: output {name!r} of shape {list(array.shape)} cannot be reshaped "
                                  f"to its config's dims {list(dims)} (reshape.shape is {list(backend_shape)})"
                                  ) from None
    return reshaped


def selected(request: InferRequest, outputs: dict[str, Array], output_names: list[str]) -> dict[str, Array]:
    """The outputs a request that ran alone asked for: no slicing. A backend returns a new dict of the
    outputs it was asked for; when those are all a request wants, that dict is its response's."""
    if request.outputs:
        return {o.name: outputs[o.name] for o in request.outputs}
    if len(outputs) == len(output_names):
        return outputs
    return {name: outputs[name] for name in output_names}


def split(model: str, version: str, output_names: list[str], batch: list[Pending], outputs: dict[str, Array],
          total_batch: int) -> list[InferResponse]:
    if total_batch == len(batch):
        return _split_rows(model, version, output_names, batch, outputs)
    responses = []
    offset = 0
    for item in batch:
        request = item.request
        wanted = [o.name for o in request.outputs] or output_names
        size = item.batch_size
        cut = {name: outputs[name][offset:offset + size] for name in wanted}
        offset += size
        responses.append(InferResponse(model, version, cut, request.id))
    return responses


def _split_rows(model: str, version: str, output_names: list[str], batch: list[Pending],
                outputs: dict[str, Array]) -> list[InferResponse]:
    """The split when every request has batch size 1 (the usual case): each output is cut into its rows
    by one call, not by a slice per request."""
    rows = {name: list(array[:, None]) for name, array in outputs.items()}
    only = output_names[0] if len(output_names) == 1 else ""  # one output: a dict display, not a comprehension
    only_rows = rows[only] if only else []
    responses = []
    for index, item in enumerate(batch):
        request = item.request
        if request.outputs:
            cut = {o.name: rows[o.name][index] for o in request.outputs}
        elif only:
            cut = {only: only_rows[index]}
        else:
            cut = {name: rows[name][index] for name in output_names}
        responses.append(InferResponse(model, version, cut, request.id))
    return responses
