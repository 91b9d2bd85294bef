"""Small CPU runs of an ONNX Runtime session through an IOBinding bound once per input layout.

For a small model most of a run is ORT's per-call work around the kernels: wrapping each input array in an
OrtValue, allocating each output and wrapping it as a numpy array. An IOBinding bound once to buffers of its
own skips that: the request's input is copied into the bound input buffer (a few hundred bytes), the run writes
into the bound output buffers, and those are copied out (docs/benchmarks.md measured the whole run at about 0.6
of a plain run for tiny_mlp).

Guarantees: a bound run returns what a plain run of the same session returns for the same inputs, in arrays of
their own (copies: the next run overwrites the bound buffers, and a response may still be waiting to be written).
A layout is bound only after a plain run of it succeeded, and only what that run proved: its input names,
dtypes and shapes, and the outputs' dtypes and shapes it produced. A run whose inputs differ in any of those, a
run that asks for other outputs, and a run on another thread while the binding is in use all run plainly. A
bound run that fails (an output whose shape depends on the data, not only on the input shapes) turns binding off
for the instance, and the run is repeated plainly, so that its result, or its error, is a plain run's. CPU
sessions only; small tensors only (above ``MAX_BYTES`` the copies cost more than ORT's per-call work), and a few
layouts per instance, so memory stays bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edged.backends.base import Array

MAX_BYTES = 64 * 1024  # inputs and outputs of one bound layout
MAX_LAYOUTS = 8  # per instance: a batching model sees a few batch sizes often
_NUMERIC = frozenset("biuf")


class _Bound:
    """One input layout's binding and the buffers it is bound to."""

    __slots__ = ("binding", "inputs", "outputs")

    def __init__(self, binding: Any, inputs: dict[str, Array], outputs: dict[str, Array]) -> None:
        self.binding = binding
        # tuples, not dicts: a run walks them with plain loops (a comprehension is a call of its own in 3.10/3.11)
        self.inputs = tuple((name, array, array.dtype) for name, array in inputs.items())
        self.outputs = tuple(outputs.items())


class Bindings:
    """The bound layouts of one CPU session (see the module docstring)."""

    def __init__(self, state: Any, session: Any) -> None:
        self._state = state  # onnxruntime.capi._pybind_state
        self._session = session  # the compiled session under ORT's Python wrapper
        self._device = state.OrtDevice(state.OrtDevice.cpu(), state.OrtDevice.default_memory(), 0)
        self._bound: dict[Any, _Bound] = {}
        self._output_names: Sequence[str] | None = None  # the outputs every bound layout was bound for
        self._lock = threading.Lock()
        self.enabled = True

    def __len__(self) -> int:
        return len(self._bound)

    def run(self, inputs: Mapping[str, Array], output_names: Sequence[str],
            run_options: Any) -> dict[str, Array] | None:
        """The outputs of a bound run, or None when this run is not bound (the caller runs it plainly)."""
        if output_names is not self._output_names and output_names != self._output_names:
            return None
        bound = None
        if len(inputs) == 1:  # _key without the call: this runs for every small request
            for name, array in inputs.items():
                bound = self._bound.get((name, array.shape))
        else:
            bound = self._bound.get(_key(inputs))
        if bound is None or not self._lock.acquire(False):
            return None
        try:
            for name, buffer, dtype in bound.inputs:
                array = inputs[name]
                if array.dtype != dtype:
                    return None
                buffer[...] = array
            self._session.run_with_iobinding(bound.binding, run_options)
            outputs = {}
            for name, buffer in bound.outputs:
                outputs[name] = buffer.copy()
            return outputs
        except Exception:  # not an answer: the caller's plain run gives the result or the error
            self.enabled = False
            self._bound.clear()
            return None
        finally:
            self._lock.release()

    def learn(self, inputs: Mapping[str, Array], output_names: Sequence[str], outputs: Mapping[str, Array]) -> None:
        """Bind the layout of a plain run that succeeded with ``outputs``, if it qualifies."""
        if not self.enabled or len(self._bound) >= MAX_LAYOUTS:
            return
        if self._output_names is None:
            self._output_names = output_names
        elif output_names != self._output_names:
            return
        arrays = [*inputs.values(), *outputs.values()]
        if any(not isinstance(array, np.ndarray) or array.dtype.kind not in _NUMERIC for array in arrays):
            self.enabled = False  # strings or other objects in this model's tensors: they cannot be bound
            return
        if sum(array.nbytes for array in arrays) > MAX_BYTES:
            return
        key = _key(inputs)
        if key in self._bound:
            return
        buffers = {name: np.empty(array.shape, array.dtype) for name, array in inputs.items()}
        results = {name: np.empty(array.shape, array.dtype) for name, array in outputs.items()}
        device = self._device
        try:
            binding = self._state.SessionIOBinding(self._session)
            for name, array in buffers.items():
                binding.bind_input(name, device, array.dtype, list(array.shape), array.ctypes.data)
            for name, array in results.items():
                binding.bind_output(name, device, array.dtype, list(array.shape), array.ctypes.data)
        except Exception:  # an ORT build whose binding API differs: plain runs, as before
            self.enabled = False
            return
        self._bound[key] = _Bound(binding, buffers, results)


def _key(inputs: Mapping[str, Array]) -> Any:
    if len(inputs) == 1:  # most edge models: one tensor, no tuple of pairs to build
        for name, array in inputs.items():
            return name, array.shape
    return tuple((name, array.shape) for name, array in inputs.items())
