"""A large BYTES ModelInfer request is decoded, and its response encoded, off the event loop (tritonclient over a
real Unix socket, a real ONNX Runtime model), as the HTTP path does it (tests/serving/test_serving_bytes_offload.py).

Not timed: a profile hook catches ``tensor_bytes`` as it starts encoding the output (``tensor_from_bytes`` as it
starts decoding the input) and, from inside it, asks the server's loop to run a callback. On the loop thread,
the callback cannot run until the work returns (the hook gives up after its timeout and the test fails); done
elsewhere, it runs meanwhile. A small BYTES request keeps the loop's path, with no hop to a thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import numpy as np
import pytest
import uvloop
from modelgen import add_identity_model

from edged.config import ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.grpcapi import GrpcServer
from edged.grpcapi._infer import OFFLOAD_ELEMENTS
from edged.shm import SharedMemoryRegistry

grpcclient = pytest.importorskip("tritonclient.grpc")
LOOP_TIMEOUT_S = 20.0


class LoopFromEncoder:
    """A profile hook: the first call of the function ``arm`` names records its thread and has the loop run a
    callback before it goes on (the result: whether the loop ran it)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.armed = False
        self.target = "tensor_bytes"
        self.elements = 0
        self.threads: list[int] = []
        self.loop_ran: bool | None = None

    def arm(self, target: str = "tensor_bytes", elements: int = 0) -> None:
        self.threads.clear()
        self.loop_ran = None
        self.target = target
        self.elements = elements  # only a call for a tensor of at least this many elements (first dimension)
        self.armed = True

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code.co_name != self.target or not self.armed:
            return
        tensor = frame.f_locals.get("shape") or getattr(frame.f_locals.get("array"), "shape", None) or (0,)
        if tensor[0] < self.elements:
            return
        self.armed = False
        self.threads.append(threading.get_ident())
        assert self.loop is not None
        if self._on_loop():
            self.loop_ran = False  # the loop is this thread, busy here: it cannot run anything meanwhile
            return
        try:
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop).result(LOOP_TIMEOUT_S)
            self.loop_ran = True
        except TimeoutError:
            self.loop_ran = False

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LoopFromEncoder, int | None]]:
    tmp = tmp_path_factory.mktemp("grpcbytes")
    add_identity_model(tmp / "repo", "strings", "BYTES", max_batch=0)
    service = InferenceService(tmp / "repo", ModelsConfig())
    service.start()
    hook = LoopFromEncoder()
    loop = uvloop.new_event_loop()
    hook.loop = loop
    threading.setprofile(hook)  # reaches the loop thread and the executor's threads, started after this
    try:
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        path = tmp / "grpc.sock"
        server = GrpcServer(service, ServerConfig(grpc_socket=str(path)), SharedMemoryRegistry())
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
        yield f"unix://{path}", hook, thread.ident
        asyncio.run_coroutine_threadsafe(server.stop(1), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        service.close(2.0)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]


def _infer(url: str, count: int) -> tuple[np.ndarray, np.ndarray]:
    values = np.array([b"g%d" % (i % 991) for i in range(count)], dtype=object)
    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput("INPUT", [count], "BYTES")
        tensor.set_data_from_numpy(values)
        result = client.infer("strings", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT")])
    finally:
        client.close()
    return values, result.as_numpy("OUTPUT")


def test_the_loop_runs_while_a_large_bytes_response_is_encoded(
        served: tuple[str, LoopFromEncoder, int | None]) -> None:
    url, hook, loop_thread = served
    hook.arm()
    values, output = _infer(url, 2 * OFFLOAD_ELEMENTS)
    assert hook.loop_ran is True
    assert hook.threads and hook.threads[0] != loop_thread
    assert output.tolist() == values.tolist()


def test_a_small_bytes_response_is_encoded_on_the_loop(served: tuple[str, LoopFromEncoder, int | None]) -> None:
    url, hook, loop_thread = served
    hook.arm()
    values, output = _infer(url, 50)
    assert hook.threads == [loop_thread]
    assert output.tolist() == values.tolist()


def test_the_loop_runs_while_a_large_bytes_request_is_decoded(
        served: tuple[str, LoopFromEncoder, int | None]) -> None:
    url, hook, loop_thread = served
    hook.arm("tensor_from_bytes")
    values, output = _infer(url, 200_000)  # 1.5 MB: past the gRPC path's OFFLOAD_BYTES
    assert hook.loop_ran is True
    assert hook.threads and hook.threads[0] != loop_thread
    assert output.tolist() == values.tolist()


def test_a_small_bytes_request_is_decoded_on_the_loop(served: tuple[str, LoopFromEncoder, int | None]) -> None:
    url, hook, loop_thread = served
    hook.arm("tensor_from_bytes")
    values, output = _infer(url, 50)
    assert hook.threads == [loop_thread]
    assert output.tolist() == values.tolist()


def test_the_loop_runs_while_a_large_bytes_stream_request_is_decoded(
        served: tuple[str, LoopFromEncoder, int | None]) -> None:
    """ModelStreamInfer: the same, and the stream's small request behind it is answered too."""
    url, hook, loop_thread = served
    results: list[Any] = []
    done = threading.Event()

    def received(result: Any, error: Any) -> None:
        results.append(error if error is not None else result.as_numpy("OUTPUT"))
        if len(results) == 2:
            done.set()

    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=received)
        hook.arm("tensor_from_bytes", 200_000)  # not the small one, which may be decoded first
        for count in (200_000, 3):
            values = np.array([b"t%d" % (i % 997) for i in range(count)], dtype=object)
            tensor = grpcclient.InferInput("INPUT", [count], "BYTES")
            tensor.set_data_from_numpy(values)
            client.async_stream_infer("strings", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT")])
        assert done.wait(120)
    finally:
        client.stop_stream()
        client.close()
    assert hook.loop_ran is True
    assert hook.threads and hook.threads[0] != loop_thread
    assert sorted(len(result) for result in results) == [3, 200_000]
