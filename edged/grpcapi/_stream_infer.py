"""ModelStreamInfer's call: requests taken from the stream as the engine answers them, under a bound.

Invariant: at most ``STREAM_IN_FLIGHT`` requests of one stream are taken and not yet answered, and none is
taken while answers wait for the client to read them. Past either, the call holds its input: its DATA is kept
unparsed and no window is granted (``_h2_inflow``), so a fast client waits in its flow control instead of
failing, and what it can make edged hold is its windows plus the bound's requests and answers. Input is taken
again once half the bound is answered and the answers are out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.message import DecodeError

from edged.errors import EdgedError
from edged.grpcapi._grpc_stream import GrpcCall
from edged.grpcapi._infer import GrpcInfer
from edged.grpcapi._status import Status, code_for
from edged.grpcapi.proto import grpc_service_pb2 as pb

log = logging.getLogger(__name__)

# Fixed rather than a multiple of max_batch_size: each request of a stream may name another model. 64 fills the
# largest batch edged's models configure with room for the next; past a batch, more queued requests add only
# latency and memory.
STREAM_IN_FLIGHT = 64


class StreamStats:
    """What the status document shows of all streams: the most requests one has had in flight at once."""

    __slots__ = ("peak",)

    def __init__(self) -> None:
        self.peak = 0


class StreamCall:
    __slots__ = ("_call", "_in_flight", "_infer", "_requests", "_stats")

    def __init__(self, call: GrpcCall, infer: GrpcInfer, stats: StreamStats) -> None:
        self._call = call
        self._infer = infer
        self._stats = stats
        self._requests: asyncio.Queue[pb.ModelInferRequest | None] = asyncio.Queue()
        self._in_flight = 0
        call.on_message = self._message
        call.on_drained = self._maybe_resume
        call.on_end = lambda: self._requests.put_nowait(None)
        call.task = asyncio.get_running_loop().create_task(self._serve())

    def _message(self, data: bytes) -> None:
        message = parse(self._call, pb.ModelInferRequest, data)
        if message is None:
            return
        self._requests.put_nowait(message)
        self._in_flight += 1
        self._stats.peak = max(self._stats.peak, self._in_flight)
        if self._in_flight >= STREAM_IN_FLIGHT:
            self._call.hold_input(True)

    def _answered(self) -> None:
        self._in_flight -= 1
        if self._call.output_waiting:  # the client does not read: take nothing more until it has
            self._call.hold_input(True)
        else:
            self._maybe_resume()

    def _maybe_resume(self) -> None:
        if self._in_flight <= STREAM_IN_FLIGHT // 2 and not self._call.output_waiting:
            self._call.hold_input(False)

    async def _incoming(self) -> AsyncIterator[pb.ModelInferRequest]:
        while (message := await self._requests.get()) is not None:
            yield message

    async def _serve(self) -> None:
        call = self._call
        try:
            async for answer in self._infer.stream(self._incoming()):
                call.send(answer)
                self._answered()
            call.close()
        except EdgedError as e:
            call.fail(code_for(e), str(e))
        except Exception as e:  # a bug answers INTERNAL, never a hung stream
            log.exception("unexpected error in a gRPC stream")
            call.fail(Status.INTERNAL, f"internal error: {e}")


def parse(call: GrpcCall, kind: Any, data: bytes) -> Any:
    """``data`` as a ``kind`` message, or None once the call is failed INVALID_ARGUMENT."""
    try:
        return kind.FromString(data)
    except DecodeError as e:
        call.fail(Status.INVALID_ARGUMENT, f"the request is not a valid {kind.__name__} message: {e}")
        return None
