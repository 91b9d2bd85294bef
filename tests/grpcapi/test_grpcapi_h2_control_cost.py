"""What the peer's control frames cost the event loop, counted (not timed): a real `GrpcServer` on a uvloop thread
in this process, raw HTTP/2 frames over its Unix socket, and the lines of edged's code the loop thread runs
for them counted by a trace hook. A SETTINGS frame or a connection WINDOW_UPDATE must not cost more with 128
idle streams open than with none (a SETTINGS_INITIAL_WINDOW_SIZE entry walked every stream, and every
WINDOW_UPDATE listed them all: one client stalled the loop both front ends share), SETTINGS frames are
bounded like the other control floods, and output held back while the client does not read leaves once it
reads again."""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
import uvloop
from h2_raw import (
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    HEADERS,
    PING,
    SETTINGS,
    WINDOW_UPDATE,
    RawH2,
    frame,
    message,
    request_block,
)

from edged.config import ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.grpcapi import GrpcServer
from edged.grpcapi._h2_control import MAX_STREAMS, SETTINGS_BURST
from edged.grpcapi.proto import grpc_service_pb2 as pb
from edged.shm import SharedMemoryRegistry

MODELS = Path(__file__).resolve().parents[2] / "models"
INITIAL_WINDOW_SIZE = 4


class EdgedLines:
    """A thread trace hook: the lines of edged's own modules run while ``recording``."""

    def __init__(self) -> None:
        self.recording = False
        self.lines = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.recording and event == "call" and "/edged/" in frame.f_code.co_filename:
            return self._line
        return None  # a frame begun while not recording is not traced: the other tests run at full speed

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and self.recording:
            self.lines += 1
        return self._line

    def count(self, run: Callable[[], None]) -> int:
        self.lines = 0
        self.recording = True
        try:
            run()
        finally:
            self.recording = False
        return self.lines


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, EdgedLines]]:
    tmp = tmp_path_factory.mktemp("cost")
    (tmp / "repo").mkdir()
    (tmp / "repo" / "tiny_mlp").symlink_to(MODELS / "tiny_mlp")
    service = InferenceService(tmp / "repo", ModelsConfig(control_mode="explicit", startup_models=("*",)))
    service.start()
    loop = uvloop.new_event_loop()
    hook = EdgedLines()
    threading.settrace(hook)  # reaches the loop thread, started now (a hook set later would miss its frames)
    try:
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
    path = tmp / "grpc.sock"
    server = GrpcServer(service, ServerConfig(grpc_socket=str(path)), SharedMemoryRegistry())
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    yield path, hook
    asyncio.run_coroutine_threadsafe(server.stop(1), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    service.close(2.0)


def _lines(hook: EdgedLines, client: RawH2, frames: bytes) -> int:
    """The lines of edged the loop runs for ``frames`` (and one PING, answered after them)."""

    def run() -> None:
        client.send(frames, frame(PING, 0, 0, b"barrier!"))
        _barrier(client)

    return hook.count(run)


def _barrier(client: RawH2, mark: bytes = b"barrier!") -> None:
    """Read up to the server's ACK of PING ``mark`` (the other ACKs answer PINGs measured)."""
    while (got := client.read()) is not None and not (got.kind == PING and got.payload == mark):
        assert got.kind != GOAWAY, f"GOAWAY {got.code}: {got.payload[8:]!r}"
    assert got is not None, "the connection closed"


def _client(path: Path, streams: int) -> RawH2:
    """A connection with ``streams`` ModelStreamInfer streams open and idle (no request sent on them)."""
    client = RawH2.unix(path)
    client.start()
    client.send(*(frame(HEADERS, END_HEADERS, 2 * index + 1, request_block("ModelStreamInfer"))
                  for index in range(streams)))
    client.send(frame(PING, 0, 0, b"opened!!"))
    while (got := client.read()) is not None and got.kind != PING:
        assert got.kind != GOAWAY and got.kind != HEADERS, "a stream was refused or ended"
    return client


def _settings(entries: int, last: int = 65535) -> bytes:
    """One SETTINGS frame of ``entries`` INITIAL_WINDOW_SIZE values, each another than the one before, ``last``
    the last."""
    values = [65535 + index % 2 for index in range(entries - 1)] + [last]
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", INITIAL_WINDOW_SIZE, value) for value in values))


def _window_updates(count: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) * count


def test_a_settings_frame_costs_the_same_with_streams_open(served: tuple[Path, EdgedLines]) -> None:
    path, hook = served
    with _client(path, 0) as alone, _client(path, MAX_STREAMS) as busy:
        _lines(hook, alone, _settings(8))
        _lines(hook, busy, _settings(8))  # both warmed up
        without = _lines(hook, alone, _settings(400, 70000))
        with_streams = _lines(hook, busy, _settings(400, 70000))
    # once per entry per stream, 128 streams cost 50 times as much; once per frame, a few hundred lines more
    assert with_streams < 2 * without, f"{with_streams} lines with {MAX_STREAMS} streams open, {without} without"


def test_a_connection_window_update_with_nothing_waiting_costs_what_a_ping_costs(
        served: tuple[Path, EdgedLines]) -> None:
    path, hook = served
    with _client(path, MAX_STREAMS) as client:
        _lines(hook, client, _window_updates(8) + frame(PING, 0, 0, bytes(8)) * 8)
        updates = _lines(hook, client, _window_updates(300))
        pings = _lines(hook, client, frame(PING, 0, 0, bytes(8)) * 300)
    assert updates < 2 * pings, f"300 WINDOW_UPDATE frames ran {updates} lines, 300 PING frames {pings}"


def test_settings_frames_past_the_burst_get_enhance_your_calm(served: tuple[Path, EdgedLines]) -> None:
    path, _ = served
    with _client(path, 0) as client:  # its first SETTINGS is spent already
        client.send(_settings(1) * (SETTINGS_BURST // 2), frame(PING, 0, 0, b"barrier!"))
        _barrier(client)  # no GOAWAY: a client's few SETTINGS frames are answered
        client.send(_settings(1) * SETTINGS_BURST)
        got_away = client.goaway()
    assert got_away.code == ENHANCE_YOUR_CALM and b"SETTINGS" in got_away.payload


def test_answers_held_while_the_client_did_not_read_leave_once_it_reads(
        served: tuple[Path, EdgedLines]) -> None:
    """A client that grants wide windows and reads nothing for a while fills the transport's buffer (paused):
    once it reads, the answers held since must all come, not stop for good."""
    path, _ = served
    count = 8000
    request = pb.ModelInferRequest(model_name="tiny_mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.ones(64, np.float32).tobytes())
    body = message(request.SerializeToString()) * count
    with RawH2.unix(path) as client:
        client.sock.settimeout(15)
        client.start(settings=struct.pack(">HI", INITIAL_WINDOW_SIZE, (1 << 31) - 1))
        client.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 31) - 1 - 65535)),
                    frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")),
                    *(frame(DATA, 0, 1, body[start:start + 16384]) for start in range(0, len(body), 16384)))
        client.send(frame(DATA, END_STREAM, 1))
        threading.Event().wait(1.0)  # not reading: the answers outgrow the socket buffers
        data, fields = b"", {}
        while not fields.get(b"grpc-status"):
            got = client.read()
            assert got is not None, "the connection closed"
            if got.kind == DATA:
                data += got.payload
            elif got.kind == HEADERS and got.stream == 1:
                fields.update(client.decoder.decode(got.payload))
    answers = 0
    while data:
        length = int.from_bytes(data[1:5], "big")
        assert not pb.ModelStreamInferResponse.FromString(data[5:5 + length]).error_message
        data, answers = data[5 + length:], answers + 1
    assert fields[b"grpc-status"] == b"0" and answers == count
