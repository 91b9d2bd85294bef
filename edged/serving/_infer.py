"""The infer hot path: body → DecodedRequest → InferRequest → engine → encoded response.

Requests are not submitted from the parser's callbacks: they are collected and submitted together, so that
requests that arrive together reach the model's scheduler together and can run as one batch. When only one
connection is sending, they are submitted as soon as its ``data_received`` has parsed what it got (pipelined
requests still go together); when several are, from one ``call_soon`` flush, so that requests that arrive on
several connections in the same event-loop iteration meet. The first costs no extra loop iteration; the second
is what lets 16 connections share batches. A fast model executes inline on the loop thread and its done
callback writes the response directly; otherwise the callback comes from a worker thread and hops back with
``call_soon_threadsafe``.

A body of ``OFFLOAD_BYTES`` or more is decoded on one decoding thread: its decode parses in pieces (see
``edged.protocol._jsondata``), so the loop keeps answering other clients meanwhile; its response keeps its
place in the connection's order like any other. One thread, not a pool: several decoding threads would each
take the GIL in turn before the loop gets it back, and decode no faster. A response with an output of
``OFFLOAD_ELEMENTS`` or more that takes Python work to encode (BYTES, or written as JSON) is encoded on that
thread too, and answered from the loop; smaller ones, and large numeric binary outputs (one copy), are encoded
on the loop, with no thread hop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edged.engine import InferenceService, InferRequest, InferResponse, RequestedOutput
from edged.errors import EdgedError, Unavailable
from edged.protocol import DecodedRequest, decode_request
from edged.protocol.header_cache import HeaderCache, RequestHeader
from edged.protocol.shm_params import ShmReader
from edged.serving._access import ShmCallerOf
from edged.serving._http import Connection
from edged.serving._limits import OFFLOAD_BYTES, OFFLOAD_ELEMENTS
from edged.serving._messages import Incoming, Slot, header_int, unqueued_when_gone
from edged.serving._response import error_for, render
from edged.serving._response_heads import ResponseHeads
from edged.shm import TCP_CALLER, SharedMemoryRegistry, write_output

# Infer requests from two different connections this close together (loop time, which has millisecond
# resolution) mean several clients are sending: gather requests in a call_soon flush for the next _HOLD_S.
_OVERLAP_S = 0.002
_HOLD_S = 0.05


class _Call(InferRequest):
    """One infer request in flight: the engine's request itself, and, called with the result, what answers the
    client. One object per request where a request and its callback were two."""

    __slots__ = ("connection", "decoded", "headers", "keep_alive", "path", "slot")

    def __init__(self, path: InferPath, connection: Connection, slot: Slot, model: str, version: str,
                 decoded: RequestHeader, inputs: dict[str, Any], parameters: dict[str, Any],
                 outputs: tuple[RequestedOutput, ...], keep_alive: bool, headers: Mapping[bytes, bytes]) -> None:
        # InferRequest's fields, set here rather than by its generated __init__ (a second call per request);
        # tests/serving/test_serving_infer_call.py checks that every field of InferRequest is set
        self.model = model
        self.inputs = inputs
        self.version = version
        self.id = decoded.id
        self.outputs = outputs
        self.parameters = parameters  # the request's own: a kept header's dict is shared
        self.priority = decoded.priority
        self.timeout_us = decoded.timeout_us
        self.cancellation = connection.cancellation  # the connection's: set when it is lost, queued ones unrun
        slot.cancel = unqueued_when_gone  # worth looking for a half-closed client that is gone (_responder)
        self.path = path
        self.connection = connection
        self.slot = slot
        self.decoded = decoded
        self.keep_alive = keep_alive
        self.headers = headers  # over TCP, what decides whether its outputs may go to shared memory

    def __call__(self, result: InferResponse | EdgedError) -> None:
        """Answer the client; from a worker thread, by coming back here on the loop thread."""
        path = self.path
        if threading.get_ident() != path.loop_thread:
            path.loop.call_soon_threadsafe(self, result)
            return
        connection, slot, keep_alive = self.connection, self.slot, self.keep_alive
        try:
            if isinstance(result, EdgedError):
                connection.respond(slot, render(error_for(result), keep_alive), not keep_alive)
                return
            for name, array in result.outputs.items():
                if array.size >= OFFLOAD_ELEMENTS and _costly(name, array, self.decoded):
                    path.encode_elsewhere(self, result)  # answers the slot from the loop when it is done
                    return
            decoded = self.decoded
            try:  # encode's work inline: no call more on the path of every small request (test_serving_hot_path)
                placed = path.place_outputs(self, result) if decoded.outputs else frozenset()
                response = path.responses.encode(result, decoded, keep_alive, placed)
            except EdgedError as e:
                connection.respond(slot, render(error_for(e), keep_alive), not keep_alive)
                return
            connection.respond(slot, response, not keep_alive)
        except Exception as e:  # runs as a loop callback: an escaping error would leave the slot unanswered
            connection.fail(slot, e, keep_alive)

    def encode(self, result: InferResponse) -> bytes:
        """The whole HTTP response for ``result``, its outputs placed in shared memory where asked (the decoding
        thread's work for a large response; a small one is encoded in ``__call__``)."""
        path, decoded, keep_alive = self.path, self.decoded, self.keep_alive
        try:
            placed = path.place_outputs(self, result) if decoded.outputs else frozenset()
            return path.responses.encode(result, decoded, keep_alive, placed)
        except EdgedError as e:
            return render(error_for(e), keep_alive)


def _costly(name: str, array: Any, decoded: RequestHeader) -> bool:
    """Whether encoding a large output takes long: BYTES (each element read by Python), or written as JSON;
    numeric binary data is one copy."""
    return array.dtype.kind in "OSU" or not decoded.binary_outputs.get(name, decoded.binary_default)


class InferPath:
    def __init__(self, service: InferenceService, max_elements: int,
                 shared_memory: SharedMemoryRegistry | None = None,
                 caller_of: ShmCallerOf = lambda tcp, peer, headers: TCP_CALLER) -> None:
        self._service = service
        self._max_elements = max_elements
        self._shm = SharedMemoryRegistry() if shared_memory is None else shared_memory
        self._caller_of = caller_of
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self._queued: list[_Call] = []
        self._scheduled = False  # a call_soon flush is pending
        self._last_sender: Connection | None = None
        self._last_sent = 0.0
        self._gather_until = 0.0
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="edged-decode")
        self._headers = HeaderCache(max_elements)
        self.responses = ResponseHeads()

    def close(self) -> None:
        self._decoder.shutdown(wait=False, cancel_futures=True)

    def encode_elsewhere(self, call: _Call, result: InferResponse) -> None:
        """Encode a large response on the decoding thread (``OFFLOAD_ELEMENTS``) and answer from the loop."""
        future = self.loop.run_in_executor(self._decoder, call.encode, result)
        future.add_done_callback(lambda done: self._encoded(call, done))

    def _encoded(self, call: _Call, done: asyncio.Future[bytes]) -> None:
        connection, slot, keep_alive = call.connection, call.slot, call.keep_alive
        try:
            if done.cancelled():
                error = Unavailable("the server is shutting down")
                connection.respond(slot, render(error_for(error), keep_alive), not keep_alive)
            elif (failure := done.exception()) is not None:
                connection.fail(slot, failure, keep_alive)
            else:
                connection.respond(slot, done.result(), not keep_alive)
        except Exception as e:  # a loop callback: nothing else would answer the slot
            connection.fail(slot, e, keep_alive)

    def handle(self, connection: Connection, incoming: Incoming, slot: Slot, model: str, version: str) -> None:
        try:
            raw_length = incoming.headers.get(b"inference-header-content-length")
            header_length = (int(raw_length) if raw_length is not None and raw_length.isdigit()
                             else header_int(incoming.headers, b"inference-header-content-length"))
            if len(incoming.body) >= OFFLOAD_BYTES:
                reader = connection.shm_reader or self._reader(connection, incoming.headers)
                validator = self._service.version_info(model, version).validator
                future = self.loop.run_in_executor(self._decoder, decode_request, incoming.body, header_length,
                                                   self._max_elements, validator.check_shapes, reader)
                future.add_done_callback(lambda done: self._decoded(connection, incoming, slot, model, version,
                                                                    done))
                return
            seen = self._headers.seen(incoming.body, header_length)
            if seen is None:  # a kept header names no shared memory (HeaderCache): only a full decode reads it
                reader = connection.shm_reader or self._reader(connection, incoming.headers)
                decoded = self._headers.decode_unseen(incoming.body, header_length, reader)
                self._queue(connection, incoming, slot, model, version, decoded, decoded.inputs,
                            decoded.parameters)
                return
        except EdgedError as e:
            connection.respond(slot, render(error_for(e), incoming.keep_alive), not incoming.keep_alive)
            return
        inputs, layout = seen
        if layout.outputs:
            self._queue(connection, incoming, slot, model, version, layout, inputs, {**layout.parameters})
            return
        # _queue without the call, for the request that names no outputs (it wants them all); a header seen
        # before goes from its kept layout to the call, with no DecodedRequest between
        parameters = layout.parameters
        self._queued.append(_Call(self, connection, slot, model, version, layout, inputs,
                                  {**parameters} if parameters else {}, (), incoming.keep_alive, incoming.headers))
        if not connection.feeding and not self._scheduled:
            self._schedule()

    def _decoded(self, connection: Connection, incoming: Incoming, slot: Slot, model: str, version: str,
                 done: asyncio.Future[DecodedRequest]) -> None:
        error = Unavailable("the server is shutting down") if done.cancelled() else done.exception()
        if isinstance(error, EdgedError):
            connection.respond(slot, render(error_for(error), incoming.keep_alive), not incoming.keep_alive)
        elif error is not None:
            connection.fail(slot, error, incoming.keep_alive)
        else:
            try:
                decoded = done.result()
                self._queue(connection, incoming, slot, model, version, decoded, decoded.inputs,
                            decoded.parameters)
            except Exception as e:  # a loop callback: nothing else would answer the slot
                connection.fail(slot, e, incoming.keep_alive)

    def _queue(self, connection: Connection, incoming: Incoming, slot: Slot, model: str, version: str,
               decoded: RequestHeader, inputs: dict[str, Any], parameters: dict[str, Any]) -> None:
        """Queue a `DecodedRequest` or a kept header's layout, with the request's own inputs and parameters."""
        outputs: tuple[RequestedOutput, ...] = ()
        if decoded.outputs:
            outputs = tuple(RequestedOutput(o.name, o.binary_data, o.class_count) for o in decoded.outputs)
        self._queued.append(_Call(self, connection, slot, model, version, decoded, inputs, parameters, outputs,
                                  incoming.keep_alive, incoming.headers))
        if not connection.feeding and not self._scheduled:  # e.g. after a lazy load: no end_of_input follows
            self._schedule()

    def _reader(self, connection: Connection, headers: Mapping[bytes, bytes]) -> ShmReader:
        """Reads a region on behalf of the request's caller, judged only when an input names a region: on the
        Unix socket its peer (groups from the access policy's peer cache; one reader per connection, whose peer
        is fixed), over TCP the request's own ``[server.tcp_restricted]`` shared-memory header (one per request:
        an infer request is admitted as inference, which says nothing about shared memory)."""
        tcp = connection.kind == "tcp"
        peer = connection.peer
        caller_of, shm = self._caller_of, self._shm
        reader: ShmReader = lambda reference: shm.readable(reference, caller_of(tcp, peer, headers))  # noqa: E731
        if not tcp:
            connection.shm_reader = reader
        return reader

    def end_of_input(self, connection: Connection) -> None:
        """``connection`` has parsed all it received: submit what it queued, now or in a flush."""
        if not self._queued:
            return
        now = connection.last_activity
        if self._last_sender is not connection:
            if now - self._last_sent < _OVERLAP_S:
                self._gather_until = now + _HOLD_S
            self._last_sender = connection
        self._last_sent = now
        if self._scheduled:
            return
        if now < self._gather_until:
            self._schedule()
        elif len(self._queued) == 1:  # _flush's lone-request case, and _submit_one's, without the calls
            call = self._queued[0]
            self._queued = []
            try:
                self._service.submit(call, call, inline=None)  # inline if the model is fast
            except EdgedError as e:
                self.finish(call, e)
            except Exception as e:
                call.connection.fail(call.slot, e, call.keep_alive)
        else:
            self._flush()

    def _schedule(self) -> None:
        self._scheduled = True
        self._service.intake.open()  # a batch whose delay ends before the flush waits for it (engine.intake)
        self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        scheduled, self._scheduled = self._scheduled, False
        calls = self._queued
        self._queued = []
        try:
            self._submit_calls(calls)
        finally:
            if scheduled:  # end_of_input also flushes directly, without having opened the intake
                self._service.intake.close()

    def _submit_calls(self, calls: list[_Call]) -> None:
        if len(calls) == 1:
            self._submit_one(calls[0])
            return
        groups: dict[tuple[str, str], list[_Call]] = {}
        for call in calls:
            groups.setdefault((call.model, call.version), []).append(call)
        for (model, version), group in groups.items():
            if len(group) == 1:
                self._submit_one(group[0])
            else:
                self._submit_group(model, version, group)

    def _submit_one(self, call: _Call) -> None:
        service = self._service
        try:
            service.submit(call, call, inline=None)  # inline if the model is fast (should_inline)
        except EdgedError as e:
            self.finish(call, e)
        except Exception as e:  # a flush runs outside any request's handler: nothing else would answer
            call.connection.fail(call.slot, e, call.keep_alive)

    def _submit_group(self, model: str, version: str, calls: Sequence[_Call]) -> None:
        """Queue the calls together so that the scheduler can batch them (one group commit)."""
        service = self._service
        try:
            service.submit_many(model, version, [(call, call) for call in calls],
                                service.should_inline(model, version))
        except Exception as e:
            for call in calls:
                call.connection.fail(call.slot, e, call.keep_alive)

    def finish(self, call: _Call, result: InferResponse | EdgedError) -> None:
        call(result)

    def place_outputs(self, call: _Call, result: InferResponse) -> frozenset[str]:
        """Write the outputs that name a shared-memory region into it; their names (no data in the body)."""
        placed = []
        for output in call.decoded.outputs:
            reference = output.shm
            array = result.outputs.get(output.name)
            if reference is None or array is None:
                continue
            connection = call.connection
            caller = self._caller_of(connection.kind == "tcp", connection.peer, call.headers)
            write_output(output.name, array, self._shm.writable(reference, caller))
            placed.append(output.name)
        return frozenset(placed)
