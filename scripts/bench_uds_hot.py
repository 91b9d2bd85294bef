"""The socket API's request path in a hot loop: a real Connection fed by data_received, the model executing.

No socket I/O: the transport only collects what would be written, so what is measured is the Python (and
ORT) work per request, without the kernel's read, write and wake-up. Run it under py-spy to split that work:

    PYTHONPATH=$PWD .venv/bin/py-spy record -r 1000 -f raw -o out.txt -- .venv/bin/python scripts/bench_uds_hot.py

With ``--counted N`` it runs N requests inside one ``functools.reduce`` call and nothing else there, for
callgrind to count their instructions (``scripts/bench_uds_instr.py`` runs it so for each tree).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
from bench_uds import ROOT, _request_body

from edged.config import ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.serving import HttpServer, open_listeners
from edged.serving._http import Connection


class _Collecting(asyncio.Transport):
    """A transport that keeps what is written; its socket is a real one, for the peer's credentials."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self.out: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sock if name == "socket" else default

    def write(self, data: Any) -> None:
        self.out.append(bytes(data))

    def pause_reading(self) -> None:  # back-pressure: only when answers lag, which the check below refuses
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return True


async def _main(requests: int, runs: int, counted: int) -> None:
    repo = Path(tempfile.mkdtemp())
    (repo / "tiny_mlp").symlink_to(ROOT / "models" / "tiny_mlp")
    # inline whatever the warm-up measured: on a loaded machine it can exceed the default bound, and a model run
    # on a worker answers after the loop turns, which a loop that never yields would pile up
    service = InferenceService(repo, ModelsConfig(inline_execution_max_us=1_000_000))
    service.start()
    config = ServerConfig()
    listeners = open_listeners(config, Path(tempfile.mkdtemp()) / "edged.sock", environ={})
    server = HttpServer(service, config)
    await server.start([item.socket for item in listeners])
    ours, _theirs = socket.socketpair()
    connection = Connection(server._app, "uds")  # the server's own dispatcher
    transport = _Collecting(ours)
    connection.connection_made(transport)
    body, header_length = _request_body()
    request = (b"POST /v2/models/tiny_mlp/infer HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: identity\r\n"
               b"Content-Length: %d\r\nInference-Header-Content-Length: %d\r\n"
               b"Content-Type: application/octet-stream\r\n\r\n" % (len(body), header_length)) + body
    for _ in range(2000):
        connection.data_received(request)
    if not transport.out[-1].startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"the request failed: {transport.out[-1][:200]!r}")
    if counted:
        transport.out.clear()
        # callgrind counts inside functools.reduce only (bench_uds_instr.py); the lambda costs both trees alike
        functools.reduce(lambda _, __: connection.data_received(request), range(counted), None)
        if len(transport.out) != counted or not transport.out[-1].startswith(b"HTTP/1.1 200"):
            raise SystemExit("the counted requests were not all answered 200")
        print(f"counted {counted} requests")
        return
    timings = []
    for _ in range(runs):
        transport.out.clear()
        began = time.perf_counter()
        for _ in range(requests):
            connection.data_received(request)
        timings.append((time.perf_counter() - began) / requests * 1e6)
        if len(transport.out) != requests:
            raise SystemExit(f"{requests} requests got {len(transport.out)} answers within the loop")
    timings.sort()
    print(f"hot loop: min {timings[0]:.1f} us/request, median {timings[len(timings) // 2]:.1f} us/request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--counted", type=int, default=0, help="run this many requests for callgrind, then exit")
    args = parser.parse_args()
    uvloop.run(_main(args.requests, args.runs, args.counted))


if __name__ == "__main__":
    main()
