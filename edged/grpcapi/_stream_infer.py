"""ModelStreamInfer's call: each request decoded and submitted as its message arrives, under a bound.

Invariants:
- Requests take the unary path's fast layouts (``_layouts``: a repeated request skips protobuf's parser, a
  repeated response is encoded by hand) and its engine callback (``GrpcInfer.begin``): no task per request. The
  answer, a ModelStreamInferResponse wrapping the response bytes as ``infer_response`` (with Triton's
  ``triton_final_response`` parameter added), leaves as the callback
  runs, so answers go out in the order they complete; those ready while one read's frames are handled (an inline
  model) leave in that read's one write (the connection's cork). A model still to load is loaded in the
  executor first, in a task of its own; a request of ``OFFLOAD_BYTES`` or more that names a BYTES input is
  decoded in the executor, in a task of its own too (its elements are read one by one).
- A request that fails (invalid input, unknown model, a failed inference) is answered in the stream by an
  ``error_message`` naming it, and the stream goes on; a message protobuf cannot parse ends the call with
  INVALID_ARGUMENT, as before the fast path.
- At most ``STREAM_IN_FLIGHT`` requests of one stream are taken and not yet answered, and none is taken while
  answers wait for the client to read them. Past either, the call holds its input: its DATA is kept unparsed
  and no window is granted (``_h2_inflow``), so a fast client waits in its flow control instead of failing, and
  what it can make edged hold is its windows plus the bound's requests and answers. Input is taken again once
  half the bound is answered and the answers are out. Answers the client does not read count toward the
  connection's ``[server] grpc_max_unsent_mb``: past it a request's answer is its RESOURCE_EXHAUSTED
  ``error_message`` instead (``GrpcCall.unread_answers``), so requests taken before the hold cannot pile up.
- The call ends with OK once the client has half-closed and every request taken is answered.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from google.protobuf.message import DecodeError

from edged.errors import EdgedError, InferenceFailed
from edged.grpcapi._grpc_stream import GrpcCall, bounded
from edged.grpcapi._infer import BYTES_INPUT, BYTES_LOOK, OFFLOAD_BYTES, GrpcInfer
from edged.grpcapi._layouts import encode_varint
from edged.grpcapi._status import Status
from edged.grpcapi._tensors import Decoded
from edged.grpcapi.proto import grpc_service_pb2 as pb

log = logging.getLogger(__name__)

# Fixed rather than a multiple of max_batch_size: each request of a stream may name another model. 64 fills the
# largest batch edged's models configure with room for the next; past a batch, more queued requests add only
# latency and memory.
STREAM_IN_FLIGHT = 64
_INFER_RESPONSE_TAG = 2 << 3 | 2  # ModelStreamInferResponse.infer_response: field 2, length-delimited
_INFER_RESPONSE_HEAD = bytes((_INFER_RESPONSE_TAG,))
# ModelInferResponse.parameters {"triton_final_response": true}, appended to each answer's bytes (protobuf merges
# a map entry wherever it comes): Triton's streamed responses say so, and clients read it to know that a request
# is complete (each of edged's requests has exactly one response)
_FINAL = bytes(pb.ModelInferResponse(parameters={"triton_final_response": pb.InferParameter(bool_param=True)})
               .SerializeToString())


class StreamStats:
    """What the status document shows of all streams: the most requests one has had in flight at once, and how
    often a stream stopped taking input (at the bound, or with answers the client had not read)."""

    __slots__ = ("holds", "peak")

    def __init__(self) -> None:
        self.peak = 0
        self.holds = 0


class StreamCall:
    __slots__ = ("_call", "_ended", "_held", "_in_flight", "_infer", "_loads", "_stats")

    def __init__(self, call: GrpcCall, infer: GrpcInfer, stats: StreamStats) -> None:
        self._call = call
        self._infer = infer
        self._stats = stats
        self._in_flight = 0
        self._held = False  # input is held (counted once per hold in ``StreamStats.holds``)
        self._ended = False  # the client half-closed: the call ends once the last request is answered
        self._loads: set[asyncio.Task[None]] = set()  # requests waiting for their model to load
        call.on_message = self._message
        call.on_drained = self._maybe_resume
        call.on_end = self._end
        call.on_cancel = self._cancel

    def _message(self, data: bytes) -> None:
        self._in_flight += 1  # before begin: an inline model answers inside it
        self._stats.peak = max(self._stats.peak, self._in_flight)
        if len(data) >= OFFLOAD_BYTES and data.find(BYTES_INPUT, 0, BYTES_LOOK) >= 0:
            task = asyncio.get_running_loop().create_task(self._decode_then_begin(data))  # BYTES: off the loop
            self._loads.add(task)
            task.add_done_callback(self._loads.discard)
            if self._in_flight >= STREAM_IN_FLIGHT:
                self._hold()
            return
        try:
            decoded = self._infer.decode(data)
        except Exception as e:  # an EdgedError is this request's answer; a bug must not end the stream either
            self._refused(data, e)
            return
        decoded.request.cancellation = self._call.cancellation  # the stream's reset or deadline unqueues it
        try:
            if self._infer.needs_load(decoded):
                task = asyncio.get_running_loop().create_task(self._load_then_begin(decoded))
                self._loads.add(task)
                task.add_done_callback(self._loads.discard)
            else:
                self._infer.begin(decoded, lambda answer: self._answer(decoded, answer), self)
        except Exception as e:  # a bug costs this request only: its error is its answer, the stream goes on
            log.exception("unexpected error in a gRPC stream request (model %s)", decoded.request.model)
            self._answer(decoded, InferenceFailed(f"internal error: {e}"))
        if self._in_flight >= STREAM_IN_FLIGHT:
            self._hold()

    def _refused(self, data: bytes, error: Exception) -> None:
        """A request the decoder refused: the call's end if protobuf cannot parse it, else its error answer."""
        message = parse(self._call, pb.ModelInferRequest, data)
        if message is None:
            return
        if not isinstance(error, EdgedError):
            log.error("unexpected error decoding a gRPC stream request (model %s)", message.model_name,
                      exc_info=error)
            error = InferenceFailed(f"internal error: {error}")
        self._sent(_error(error, message.model_name, message.model_version, message.id))

    async def _decode_then_begin(self, data: bytes) -> None:
        """A large request naming a BYTES input, decoded in the executor (``OFFLOAD_BYTES``), then begun here."""
        try:
            decoded = await asyncio.get_running_loop().run_in_executor(None, self._infer.decode, data)
        except Exception as e:  # as in _message: its answer, or the call's end if protobuf cannot parse it
            self._refused(data, e)
            return
        decoded.request.cancellation = self._call.cancellation
        try:
            if self._infer.needs_load(decoded):
                await self._load_then_begin(decoded)
            else:
                self._infer.begin(decoded, lambda answer: self._answer(decoded, answer), self)
        except Exception as e:  # a bug costs this request only
            log.exception("unexpected error in a gRPC stream request (model %s)", decoded.request.model)
            self._answer(decoded, InferenceFailed(f"internal error: {e}"))

    async def _load_then_begin(self, decoded: Decoded) -> None:
        try:
            await self._infer.load(decoded)
        except EdgedError as e:
            self._answer(decoded, e)
            return
        self._infer.begin(decoded, lambda answer: self._answer(decoded, answer), self)

    def _answer(self, decoded: Decoded, answer: bytes | EdgedError) -> None:
        if isinstance(answer, bytes) and self._call.output.unsent and (unread := self._call.unread_answers(
                f"an answer of {len(answer)} bytes")) is not None:
            answer = unread  # the client has not read what it was sent: this answer is its error, a few bytes
        if isinstance(answer, bytes):
            # ModelStreamInferResponse(infer_response=...) around the response's bytes, without protobuf
            size = len(answer) + len(_FINAL)
            head = bytes((_INFER_RESPONSE_TAG, size)) if size < 0x80 else _INFER_RESPONSE_HEAD + encode_varint(size)
            self._sent(answer, head, _FINAL)
        else:
            request = decoded.request
            self._sent(_error(answer, request.model, request.version, request.id))

    def _sent(self, message: bytes, lead: bytes = b"", tail: bytes = b"") -> None:
        """Send one request's answer and account for it: the call ends after the last, input waits for a reader."""
        call = self._call
        call.send(message, lead, tail)
        self._in_flight -= 1
        if self._ended and not self._in_flight:
            call.close()
        elif call.output_waiting:  # the client does not read: take nothing more until it has
            self._hold()
        elif self._held:
            self._maybe_resume()

    def _hold(self) -> None:
        if not self._held:
            self._held = True
            self._stats.holds += 1
        self._call.hold_input(True)

    def _maybe_resume(self) -> None:
        if self._held and self._in_flight <= STREAM_IN_FLIGHT // 2 and not self._call.output_waiting:
            self._held = False
            self._call.hold_input(False)

    def _end(self) -> None:
        self._ended = True
        if not self._in_flight:
            self._call.close()

    def _cancel(self) -> None:
        for task in list(self._loads):
            task.cancel()


def _error(error: EdgedError, model: str, version: str, request_id: str) -> bytes:
    answer = pb.ModelStreamInferResponse(error_message=bounded(str(error)), infer_response=pb.ModelInferResponse(
        model_name=model, model_version=version, id=request_id))
    return bytes(answer.SerializeToString())


def parse(call: GrpcCall, kind: Any, data: bytes) -> Any:
    """``data`` as a ``kind`` message, or None once the call is failed INVALID_ARGUMENT."""
    try:
        return kind.FromString(data)
    except DecodeError as e:
        call.fail(Status.INVALID_ARGUMENT, f"the request is not a valid {kind.__name__} message: {e}")
        return None
