"""The infer path's per-request object is the engine's InferRequest itself (edged.serving._infer._Call)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np

from edged.engine import Cancellation, InferRequest, RequestedOutput
from edged.protocol import DecodedRequest
from edged.serving._infer import _Call
from edged.serving._messages import Incoming


def test_the_call_sets_every_field_of_the_engines_request_as_the_request_says() -> None:
    # _Call sets InferRequest's fields itself (no second __init__ per request): a field added to InferRequest
    # must be set there too, or the engine would read an unset slot
    inputs = {"input": np.zeros((1, 4), np.float32)}
    decoded = DecodedRequest(inputs, (), "req-7", {"sequence_id": 3}, 2, 1500)
    outputs = (RequestedOutput("output", True, 0),)
    slot = Incoming(b"POST", b"/v2/models/m/infer", {}, b"", True, 0)
    connection = SimpleNamespace(cancellation=Cancellation())  # all _Call reads of its connection when made
    call = _Call(None, connection, slot, "m", "2", decoded, decoded.inputs, decoded.parameters,  # type: ignore[arg-type]
                 outputs, True, {})
    # the connection's one cancellation: set when it is lost, so its queued requests are not run
    expected = InferRequest("m", inputs, "2", "req-7", outputs, {"sequence_id": 3}, 2, 1500, connection.cancellation)
    assert isinstance(call, InferRequest)
    for field in dataclasses.fields(InferRequest):
        assert getattr(call, field.name) == getattr(expected, field.name), field.name
