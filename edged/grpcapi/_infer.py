"""ModelInfer and ModelStreamInfer on the shared engine, as the HTTP infer path calls it.

A request is decoded on the loop (``decode``: through a cached layout when the bytes around its tensors repeat,
``_layouts``), submitted with ``InferenceService.submit`` (inline when the engine says the model is fast enough)
and its done callback encodes the response to its serialised bytes and hands them on (``begin``: the unary
path, with no task or future), hopping back to the loop with ``call_soon_threadsafe`` when it runs on a worker
thread; a response with a BYTES output of ``OFFLOAD_ELEMENTS`` or more is encoded in the executor instead, and
handed on from the loop. A lazily loaded model is loaded in the executor first. ModelStreamInfer takes the
same ``decode`` and ``begin`` for each of its messages (``_stream_infer``).

Several clients: requests from two senders (connections, or streams) within ``_OVERLAP_S`` of each other mean
concurrent traffic, and for the next ``_HOLD_S`` the requests of a loop iteration are gathered and submitted
in one call_soon flush, by model as one group, with the engine's intake open meanwhile (`edged.engine.intake`):
a batch whose delay ends while the loop is still reading them waits for them, and they batch together, as on
the HTTP path (`edged.serving._infer`). A single client's requests are submitted at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from edged.engine import InferenceService, InferRequest, InferResponse
from edged.errors import EdgedError, InferenceFailed, Unavailable
from edged.grpcapi._layouts import RequestLayouts, ResponseLayouts
from edged.grpcapi._tensors import Decoded, encode_infer
from edged.protocol.shm_params import ShmReference
from edged.shm import TCP_CALLER, Caller, SharedMemoryRegistry

log = logging.getLogger(__name__)
_Result = InferResponse | EdgedError
_Answer = bytes | EdgedError  # a serialised ModelInferResponse, or why there is none
_Done = Callable[[_Result], None]
# Infer requests from two different senders this close together (loop time) mean several clients are sending:
# gather the requests of each loop iteration into one flush for the next _HOLD_S (the HTTP path's figures).
_OVERLAP_S = 0.002
_HOLD_S = 0.05
# A response with a BYTES output of this many elements is encoded in the executor, off the loop (the HTTP
# path's figure, serving._limits.OFFLOAD_ELEMENTS): its elements are read one by one.
OFFLOAD_ELEMENTS = 16 * 1024
# A ModelInfer message this large whose first bytes name a BYTES tensor (an input's datatype field, 2, of length 5)
# is decoded in the executor (unary: GrpcServer._start_infer, streams: StreamCall): its elements are read one by
# one. Numeric ones (camera frames) stay on the loop, where a repeated layout skips protobuf; a false match only
# costs the hop.
OFFLOAD_BYTES = 1024 * 1024
BYTES_INPUT = b"\x12\x05BYTES"
BYTES_LOOK = 64 * 1024


def _tcp_caller() -> Caller:
    """A TCP call admitted to shared memory by its [server.tcp_restricted] key (GrpcServer picks the path)."""
    return TCP_CALLER


class Gathering:
    """Which sender sent last and the requests gathered for this loop iteration's flush: one per server, shared
    by every inference path (each Unix-socket connection has its own, for its caller), so that concurrent
    clients are told apart and gathered whichever socket they came by."""

    __slots__ = ("gather_until", "last_sender", "last_sent", "queued")

    def __init__(self) -> None:
        self.last_sender: object = None
        self.last_sent = 0.0
        self.gather_until = 0.0  # loop time until which requests are gathered (several senders seen)
        self.queued: list[tuple[InferRequest, _Done, Callable[[_Answer], None]]] = []


class GrpcInfer:
    def __init__(self, service: InferenceService, shared_memory: SharedMemoryRegistry, max_elements: int,
                 caller: Callable[[], Caller] = _tcp_caller, gathering: Gathering | None = None) -> None:
        self._caller = caller  # who shared memory is read and written as (per use: groups from the peer cache)
        self._service = service
        self._shm = shared_memory
        self._max_elements = max_elements
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        requests = RequestLayouts(max_elements, self._read)
        # a serialised ModelInferRequest as the engine's request; InvalidInput when it is not a valid one
        self.decode: Callable[[bytes], Decoded] = requests.decode
        self._responses = ResponseLayouts()
        self._gathering = Gathering() if gathering is None else gathering

    def needs_load(self, decoded: Decoded) -> bool:
        return self._service.needs_load(decoded.request.model)

    async def load(self, decoded: Decoded) -> None:
        """Load the model ``decoded`` names (in the executor: loading blocks); EdgedError if it cannot be."""
        await self._loop.run_in_executor(None, self._service.ensure_loaded, decoded.request.model)

    async def infer(self, decoded: Decoded) -> bytes:
        """The serialised response, or an EdgedError raised for the caller to turn into a status."""
        if self.needs_load(decoded):
            await self.load(decoded)
        future: asyncio.Future[_Answer] = self._loop.create_future()
        self.begin(decoded, lambda answer: _resolve(future, answer))
        answer = await future
        if isinstance(answer, EdgedError):
            raise answer
        return answer

    def begin(self, decoded: Decoded, finish: Callable[[_Answer], None], sender: object = None) -> None:
        """Submit ``decoded`` and have ``finish`` called on the loop with the response or the error: the unary
        path, with no task and no future (the model is loaded: see ``needs_load``). ``sender`` (its connection
        or stream) tells concurrent clients apart, whose requests are gathered (module docstring)."""
        try:
            loop_thread = self._loop_thread

            def done(result: _Result) -> None:
                if threading.get_ident() == loop_thread:
                    self._encode(result, decoded, finish)
                else:
                    self._loop.call_soon_threadsafe(self._encode, result, decoded, finish)

            if sender is not None:
                now = self._loop.time()
                gathering = self._gathering
                if sender is not gathering.last_sender:
                    if now - gathering.last_sent < _OVERLAP_S:
                        gathering.gather_until = now + _HOLD_S
                    gathering.last_sender = sender
                gathering.last_sent = now
                if now < gathering.gather_until:
                    if not gathering.queued:
                        self._service.intake.open()  # closed by the flush
                        self._loop.call_soon(self._flush)
                    gathering.queued.append((decoded.request, done, finish))
                    return
            # inline if the model is fast, decided on the version submit resolves anyway (one lookup)
            self._service.submit(decoded.request, done, inline=None)
        except EdgedError as e:
            finish(e)

    def _flush(self) -> None:
        """Submit the requests gathered in this loop iteration: those of one model version as one group."""
        gathering = self._gathering
        queued, gathering.queued = gathering.queued, []
        service = self._service
        try:
            groups: dict[tuple[str, str], list[tuple[InferRequest, _Done, Callable[[_Answer], None]]]] = {}
            for item in queued:
                groups.setdefault((item[0].model, item[0].version), []).append(item)
            for (model, version), group in groups.items():
                if len(group) == 1:
                    request, done, finish = group[0]
                    try:
                        service.submit(request, done, inline=None)
                    except EdgedError as e:
                        finish(e)
                    continue
                try:  # every error, one found before queueing too, reaches each request's done
                    service.submit_many(model, version, [(request, done) for request, done, _ in group],
                                        service.should_inline(model, version))
                except Exception as e:  # a flush runs outside any call's handler: nobody else would answer
                    log.exception("unexpected error submitting gathered gRPC requests (model %s)", model)
                    for _, _, finish in group:
                        finish(InferenceFailed(f"internal error: {e}"))
        finally:
            service.intake.close()

    def _encode(self, result: _Result, decoded: Decoded, finish: Callable[[_Answer], None]) -> None:
        if isinstance(result, EdgedError):
            finish(result)
            return
        for array in result.outputs.values():
            if array.size >= OFFLOAD_ELEMENTS and array.dtype.kind in "OSU":
                self._encode_elsewhere(result, decoded, finish)
                return
        try:
            answer = self._responses.encode(result, decoded.outputs, self._write)
        except EdgedError as e:
            finish(e)
            return
        except Exception as e:  # a bug answers INTERNAL: this runs in a loop callback, nobody else would answer
            log.exception("unexpected error encoding a gRPC response (model %s)", result.model)
            finish(InferenceFailed(f"internal error: {e}"))
            return
        finish(answer)

    def _encode_elsewhere(self, result: InferResponse, decoded: Decoded, finish: Callable[[_Answer], None]) -> None:
        """A response with a large BYTES output, encoded in the executor (protobuf's own encoding, no layout:
        the layouts are the loop's) and handed to ``finish`` on the loop."""
        def encode() -> _Answer:
            try:
                return encode_infer(result, decoded.outputs, self._write).SerializeToString()
            except EdgedError as e:
                return e

        def done(future: asyncio.Future[_Answer]) -> None:
            if future.cancelled():
                finish(Unavailable("the server is shutting down"))
            elif (error := future.exception()) is not None:
                log.error("unexpected error encoding a gRPC response (model %s): %s", result.model, error)
                finish(InferenceFailed(f"internal error: {error}"))
            else:
                finish(future.result())

        self._loop.run_in_executor(None, encode).add_done_callback(done)

    def _read(self, reference: ShmReference) -> memoryview:
        return self._shm.readable(reference, self._caller())

    def _write(self, reference: ShmReference) -> memoryview:
        return self._shm.writable(reference, self._caller())


def _resolve(future: asyncio.Future[_Answer], result: _Answer) -> None:
    if not future.done():  # the call was cancelled (client went away) while the engine worked
        future.set_result(result)
