"""Triton's classification extension: an output asked for with ``classification: k`` comes back as the top k
classes, each a BYTES string ``"score:index"`` or ``"score:index:label"``, best first.

The score is written as Triton writes it (``std::to_string`` of the element): six decimals for a float output,
the exact integer for an integer or BOOL one. Ties keep index order."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edged.engine.types import Array
from edged.errors import InvalidInput
from edged.protocol.datatypes import kserve_datatype
from edged.repository import MAX_LABEL_BYTES, confined_path, read_confined
from edged.repository.model_config import ModelConfig


def load_labels(config: ModelConfig, model_dir: Path) -> dict[str, list[str]]:
    """Each output's labels from its ``label_filename`` (one label per line), where the file exists; a name
    leading outside the model folder is a ModelConfigError."""
    labels: dict[str, list[str]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        what = f"label_filename of output {output.name!r}"
        if not confined_path(model_dir, output.label_filename, what, must_exist=False).exists():
            continue  # removed since the load checked it (check_config_files): scores without labels
        raw = read_confined(model_dir, output.label_filename, what, max_bytes=MAX_LABEL_BYTES)
        labels[output.name] = raw.decode("utf-8", errors="replace").splitlines()
    return labels


def classify(array: Array, count: int, labels: list[str] | None, batched: bool, model: str, name: str) -> Array:
    """The top ``count`` classes of each batch item (or of the whole tensor when not batched)."""
    if array.dtype.kind not in "biuf":
        raise InvalidInput(f"model {model}: output {name!r} is {kserve_datatype(array)}: classification needs a "
                           "numeric or BOOL output; ask for it without \"classification\"")
    rows = array.reshape(array.shape[0], -1) if batched else array.reshape(1, -1)
    k = min(count, rows.shape[1])
    # descending order as an ascending key: ~x (-x - 1) cannot overflow, where -x wraps an unsigned 0 to the top
    # and leaves a signed minimum there, and is logical not for BOOL, whose negation numpy refuses
    order = np.argsort(-rows if rows.dtype.kind == "f" else ~rows, axis=1, kind="stable")[:, :k]
    integral = rows.dtype.kind != "f"
    result = np.empty((rows.shape[0], k), dtype=object)
    for r, indices in enumerate(order):
        for c, index in enumerate(indices):
            value = rows[r, index]
            score = str(int(value)) if integral else f"{float(value):f}"
            text = f"{score}:{int(index)}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            result[r, c] = text.encode()
    return result if batched else result.reshape(k)
