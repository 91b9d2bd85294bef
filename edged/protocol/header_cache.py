"""Binary infer requests whose JSON header was seen before skip parsing and checking it again.

A client of the binary-data extension repeats one JSON header request after request (perf_analyzer and
Triton's clients do; only the tensor bytes after it change), and parsing and checking that header is a good
part of a small request's cost (docs/benchmarks.md). The first request with a header is decoded in full by
`decode_request`; if all its inputs are numeric binary data (no shared memory, no BYTES, no JSON data), what
the header says is kept as a `Layout`, keyed by the header's exact bytes. Later requests with the same bytes
only have their tensors viewed in place.

Guarantees: a request decoded from the cache equals what `decode_request` returns for it (the same inputs,
outputs, id and parameters, each request its own dicts); a body whose tensor bytes do not add up to what the
header declares is decoded in full, so it gets the same error; nothing the data holds is checked here, since
nothing about the data is (finiteness and value ranges are the engine's, after decoding). The cache is bounded
by entries and by header size, and emptied when full, so a client that varies its header (a new "id" each
time) costs a parse per request, as without it, and cannot grow memory.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np

from edged.protocol._nonfinite import loads
from edged.protocol.codec import DecodedRequest, OutputRequest, decode_request
from edged.protocol.datatypes import KSERVE_TO_NUMPY
from edged.protocol.shm_params import ShmReader

MAX_ENTRIES = 64
MAX_HEADER_BYTES = 4096  # headers of a few tensors are a few hundred bytes; larger ones are not kept


class RequestHeader(Protocol):
    """What an infer request's JSON header says besides its inputs: a `DecodedRequest`, or a kept `Layout`
    (shared by every request that repeats its header: read only)."""

    @property
    def outputs(self) -> tuple[OutputRequest, ...]: ...
    @property
    def id(self) -> str: ...
    @property
    def parameters(self) -> dict[str, Any]: ...
    @property
    def priority(self) -> int: ...
    @property
    def timeout_us(self) -> int: ...
    @property
    def binary_outputs(self) -> dict[str, bool]: ...
    @property
    def binary_default(self) -> bool: ...


class Layout(NamedTuple):
    """What a kept header says; its field names are DecodedRequest's, so it answers as one for the response."""

    inputs: tuple[tuple[str, np.dtype[Any], tuple[int, ...], int, int], ...]  # name, wire dtype, shape, count, size
    data_bytes: int
    outputs: tuple[OutputRequest, ...]
    id: str
    parameters: dict[str, Any]
    priority: int
    timeout_us: int
    binary_outputs: dict[str, bool]
    binary_default: bool


class HeaderCache:
    """Decodes infer request bodies like `decode_request`, remembering binary requests' headers."""

    def __init__(self, max_elements: int) -> None:
        self._max_elements = max_elements
        self._layouts: dict[bytes, Layout] = {}

    def __len__(self) -> int:
        return len(self._layouts)

    def decode(self, body: bytes | bytearray, header_length: int | None,
               shm: ShmReader | None = None) -> DecodedRequest:
        seen = self.seen(body, header_length)
        if seen is None:
            return self.decode_unseen(body, header_length, shm)
        inputs, layout = seen
        # each request its own dicts; a display, not dict(): no call per copy
        return DecodedRequest(inputs, layout.outputs, layout.id, {**layout.parameters}, layout.priority,
                              layout.timeout_us, {**layout.binary_outputs}, layout.binary_default)

    def seen(self, body: bytes | bytearray, header_length: int | None) -> tuple[dict[str, Any], Layout] | None:
        """The inputs viewed in place and the header's layout, for a body whose header was kept and whose tensor
        bytes add up to it; None for any other body (`decode_unseen` decodes it). The layout's dicts are shared
        by every request with this header: read them, never change them."""
        if header_length is None or not 0 < header_length <= MAX_HEADER_BYTES or header_length > len(body):
            return None
        layout = self._layouts.get(bytes(body[:header_length]))
        if layout is None or layout.data_bytes != len(body) - header_length:
            return None
        inputs = {}
        offset = header_length
        for name, wire, shape, _count, size in layout.inputs:
            # one array of the shape over the body (the data_bytes check keeps it inside); frombuffer + reshape
            # made two, 0.4 µs more per input
            inputs[name] = np.ndarray(shape, wire, body, offset)
            offset += size
        return inputs, layout

    def decode_unseen(self, body: bytes | bytearray, header_length: int | None,
                      shm: ShmReader | None = None) -> DecodedRequest:
        """`decode_request`, keeping the header's layout if it qualifies and is new."""
        decoded = decode_request(body, header_length, self._max_elements, shm=shm)
        if header_length is not None and 0 < header_length <= MAX_HEADER_BYTES and header_length <= len(body):
            header = bytes(body[:header_length])
            if header not in self._layouts:
                self._remember(header, decoded)
        return decoded

    def _remember(self, header: bytes, decoded: DecodedRequest) -> None:
        """Keep the layout of a request that decoded without error, if its inputs are all numeric binary."""
        doc = loads(header)  # parsed and checked by decode_request already
        entries = []
        data_bytes = 0
        for entry in doc["inputs"]:
            params = entry.get("parameters")
            dtype = KSERVE_TO_NUMPY.get(entry["datatype"])
            if (not isinstance(params, dict) or params.keys() != {"binary_data_size"} or dtype is None
                    or dtype.kind == "O"):
                return  # shared memory, JSON data or BYTES: decoded in full every time
            array = decoded.inputs[entry["name"]]
            size = params["binary_data_size"]
            entries.append((entry["name"], array.dtype, array.shape, array.size, size))
            data_bytes += size
        if len(self._layouts) >= MAX_ENTRIES:
            self._layouts.clear()
        self._layouts[header] = Layout(tuple(entries), data_bytes, decoded.outputs, decoded.id,
                                        dict(decoded.parameters), decoded.priority, decoded.timeout_us,
                                        dict(decoded.binary_outputs), decoded.binary_default)
