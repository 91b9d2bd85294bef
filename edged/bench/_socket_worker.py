"""Load generator for the socket transports, run in its own process so client and server don't share a GIL.

Reads a JSON job on stdin: {"unix": path | null, "host": str, "port": int, "model": str, "body_hex": str,
"header_length": int | null, "concurrency": int, "duration_s": float}; writes {"latencies_us": [...],
"errors": n, "seconds": s, "first_error": str} on stdout. Each connection is an HTTP/1.1 keep-alive loop that
sends the same pre-encoded request (KServe binary-data extension), as a real client of a fixed-size sensor would.
With shared memory ("shm_keys", "bodies_hex", "input_hex") each connection sends its own JSON header naming its
region, and copies the input bytes into the region before each request.
"""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import sys
import time
from collections.abc import Callable
from typing import Any


def _request_bytes(job: dict[str, Any]) -> bytes:
    body = bytes.fromhex(job["body_hex"])
    headers = [f"POST /v2/models/{job['model']}/infer HTTP/1.1", "Host: edged",
               f"Content-Length: {len(body)}", "Content-Type: application/octet-stream"]
    if job.get("header_length") is not None:
        headers.append(f"Inference-Header-Content-Length: {job['header_length']}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return status


def _requests(job: dict[str, Any]) -> list[bytes]:
    """One request per connection: the same one, or with shared memory each connection's own."""
    if "bodies_hex" in job:
        return [_request_bytes({**job, "body_hex": body}) for body in job["bodies_hex"]]
    return [_request_bytes(job)] * job["concurrency"]


def _frame_writer(job: dict[str, Any], index: int) -> Callable[[], None]:
    """Copies the input into this connection's region before each request (nothing without shared memory)."""
    if "shm_keys" not in job:
        return lambda: None
    raw = bytes.fromhex(job["input_hex"])
    fd = os.open("/dev/shm/" + job["shm_keys"][index].lstrip("/"), os.O_RDWR)
    region = mmap.mmap(fd, 0)
    os.close(fd)
    size = len(raw)

    def write() -> None:
        region[:size] = raw
    return write


async def _connection(job: dict[str, Any], request: bytes, end: float, out: list[float],
                      errors: list[str], write_frame: Callable[[], None]) -> None:
    if job.get("unix"):
        reader, writer = await asyncio.open_unix_connection(job["unix"])
    else:
        reader, writer = await asyncio.open_connection(job["host"], job["port"])
    clock = time.perf_counter
    try:
        while True:
            began = clock()
            if began >= end:
                return
            write_frame()
            writer.write(request)
            status = await _read_response(reader)
            if status != 200:
                errors.append(f"HTTP {status}")
                continue
            out.append((clock() - began) * 1e6)
    finally:
        writer.close()


async def run(job: dict[str, Any]) -> dict[str, Any]:
    requests = _requests(job)
    writers = [_frame_writer(job, index) for index in range(job["concurrency"])]
    latencies: list[float] = []
    errors: list[str] = []
    began = time.perf_counter()
    end = began + job["duration_s"]
    await asyncio.gather(*(_connection(job, request, end, latencies, errors, write)
                           for request, write in zip(requests, writers, strict=True)))
    return {"latencies_us": latencies, "errors": len(errors), "seconds": time.perf_counter() - began,
            "first_error": errors[0] if errors else ""}


def main() -> None:
    job = json.loads(sys.stdin.read())
    try:
        import uvloop
        result = uvloop.run(run(job))
    except ImportError:
        result = asyncio.run(run(job))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
