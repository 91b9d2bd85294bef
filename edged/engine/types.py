"""Requests and responses as the engine sees them: named numpy arrays plus KServe v2 request fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary_data: bool | None = None  # transport hint (KServe binary extension); the engine ignores it
    class_count: int = 0  # Triton classification extension: top-k as "score:index[:label]" strings


class Cancellation:
    """Set by a front end when the caller of a request is gone. A request still queued then is not run: the
    scheduler finishes it with RequestCancelled when it would take it into a batch (Triton checks cancellation
    there too); one already running completes and its answer is dropped by the front end."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False


@dataclass(slots=True)
class InferRequest:
    model: str
    inputs: dict[str, Array]
    version: str = ""  # "" = the model's default (highest ready) version
    id: str = ""
    outputs: tuple[RequestedOutput, ...] = ()  # empty: all outputs
    parameters: dict[str, Any] = field(default_factory=dict)
    priority: int = 0  # 0 = the model's default priority level
    timeout_us: int = 0  # 0 = the model's queue policy default (or none)
    cancellation: Cancellation | None = None  # set when its caller goes away (None: it cannot)


@dataclass(slots=True)
class InferResponse:
    model: str
    version: str
    outputs: dict[str, Array]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
