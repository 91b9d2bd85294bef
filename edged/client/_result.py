"""The result of one inference: output tensors as numpy arrays plus the response's JSON document."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class InferResult:
    outputs: Mapping[str, Array]
    doc: Mapping[str, Any]

    @property
    def model_name(self) -> str:
        return str(self.doc.get("model_name", ""))

    @property
    def model_version(self) -> str:
        return str(self.doc.get("model_version", ""))

    @property
    def id(self) -> str:
        return str(self.doc.get("id", ""))

    @property
    def parameters(self) -> Mapping[str, Any]:
        params = self.doc.get("parameters")
        return params if isinstance(params, dict) else {}

    def shape(self, name: str) -> list[int]:
        """The shape of output ``name`` as the response states it (for outputs written to shared memory too)."""
        for entry in self.doc.get("outputs", []):
            if isinstance(entry, dict) and entry.get("name") == name:
                return [int(d) for d in entry.get("shape", [])]
        raise KeyError(f"output {name!r} is not in the response")

    def as_numpy(self, name: str) -> Array:
        """The output ``name``; a KeyError names the outputs the response has."""
        try:
            return self.outputs[name]
        except KeyError:
            raise KeyError(f"output {name!r} is not in the response (it has {sorted(self.outputs)})") from None
