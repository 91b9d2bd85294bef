"""A hypothesis fuzz of edged's HTTP/2 frame parser: after a valid preface, random bytes or random (but framed)
frames sent over a real Unix socket to a GrpcServer on this test's loop must end, at worst, in a GOAWAY with an
RFC 9113 error code, never in an exception escaping into the event loop, and the server must answer a fresh
client afterwards."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

from h2_raw import GOAWAY, PREFACE, SETTINGS, frame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edged.config import ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.grpcapi import GrpcServer
from edged.grpcapi._h2_frames import ErrorCode
from edged.shm import SharedMemoryRegistry

FRAMES = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 255), st.integers(0, 9),
                            st.binary(max_size=64)), max_size=12)
PING_BARRIER = frame(6, 0, 0, b"barrier!")


async def _exchange(path: Path, data: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(PREFACE + frame(SETTINGS, 0, 0) + data + PING_BARRIER)
    await writer.drain()
    writer.write_eof()
    received = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return received


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos + 9 <= len(data):
        word = struct.unpack_from(">I", data, pos)[0]
        out.append((word & 0xFF, data[pos + 9:pos + 9 + (word >> 8)]))
        pos += 9 + (word >> 8)
    return out


def _fuzz_once(tmp: Path, data: bytes) -> None:
    problems: list[dict[str, Any]] = []

    async def run() -> bytes:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: problems.append(context))
        path = tmp / "fuzz.sock"
        server = GrpcServer(InferenceService(tmp, ModelsConfig()), ServerConfig(grpc_socket=str(path)),
                            SharedMemoryRegistry())
        await server.start()
        try:
            answer = await _exchange(path, data)
            after = await _exchange(path, b"")  # a fresh client is served
            assert any(kind == 6 for kind, _ in _frames(after)), "no PING ACK for the next client"
            return answer
        finally:
            await server.stop(1)

    answer = asyncio.run(run())
    assert not problems, problems
    for kind, payload in _frames(answer):
        if kind == GOAWAY:
            assert struct.unpack_from(">I", payload, 4)[0] in set(ErrorCode)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=600))
def test_random_bytes_after_the_preface_end_cleanly(tmp_path: Path, data: bytes) -> None:
    _fuzz_once(tmp_path, data)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=FRAMES)
def test_random_frames_after_the_preface_end_cleanly(tmp_path: Path, frames: list[tuple[int, int, int, bytes]],
                                                     ) -> None:
    _fuzz_once(tmp_path, b"".join(frame(kind, flags, stream, payload) for kind, flags, stream, payload in frames))
