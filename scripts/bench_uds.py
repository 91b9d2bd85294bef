"""Measure the socket API's hot path: infer/s and latency over a Unix socket, against a canned server.

One keep-alive http.client connection per client process, tiny_mlp, batch 1, binary-data extension. The same
client runs against a canned-response asyncio server (the client's and the kernel's own cost) and against
edged's HttpServer, 3 runs x 5 s each; then 16 connections (16 client processes) against edged.

    .venv/bin/python scripts/bench_uds.py [--seconds 5] [--runs 3] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


def _request_body() -> tuple[bytes, int]:
    import numpy as np

    from edged.protocol import encode_request
    body, header_length = encode_request({"input": np.random.default_rng(0).random((1, 64), np.float32)})
    return body, header_length or 0


def run_client(path: str, start_at: float, stop_at: float) -> None:
    body, header_length = _request_body()
    headers = {"Inference-Header-Content-Length": str(header_length), "Content-Type": "application/octet-stream"}
    conn = _UnixConnection(path)
    latencies: list[int] = []
    while time.time() < start_at:
        time.sleep(0.001)
    clock = time.perf_counter_ns
    end = clock() + int((stop_at - time.time()) * 1e9)
    began = clock()
    while True:
        t0 = clock()
        if t0 >= end:
            break
        conn.request("POST", "/v2/models/tiny_mlp/infer", body, headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"HTTP {response.status}")
        latencies.append(clock() - t0)
    print(json.dumps({"count": len(latencies), "seconds": (clock() - began) / 1e9,
                      "latencies_us": [v // 1000 for v in latencies]}))


def serve_canned(path: str) -> None:
    import httptools
    import numpy as np
    import uvloop

    from edged.protocol import encode_response

    class Out:
        model, version, id, parameters = "tiny_mlp", "1", "", {}
        outputs = {"output": np.zeros((1, 10), np.float32)}
    payload, header_length = encode_response(Out(), {}, True)
    reply = (b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n"
             b"inference-header-content-length: %d\r\n\r\n" % (len(payload), header_length or 0)) + payload

    class Canned(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            self.transport.write(reply)  # type: ignore[attr-defined]

    async def main() -> None:
        server = await asyncio.get_running_loop().create_unix_server(Canned, path)
        print("ready", flush=True)
        await server.serve_forever()
    uvloop.run(main())


def serve_edged(path: str) -> None:
    import uvloop

    from edged.config import ModelsConfig, ServerConfig
    from edged.engine import InferenceService
    from edged.serving import HttpServer, open_listeners

    repo = Path(tempfile.mkdtemp())
    (repo / "tiny_mlp").symlink_to(ROOT / "models" / "tiny_mlp")
    service = InferenceService(repo, ModelsConfig())
    service.start()
    version = service.version_info("tiny_mlp")
    # a loaded machine can time the warm-up above inline_execution_max_us: then requests hop to a worker thread,
    # and two servers compared side by side must both say the same here
    print(f"tiny_mlp warm-up p50 {version.exec_p50_us} us, inline: {service.should_inline('tiny_mlp')}",
          file=sys.stderr, flush=True)
    config = ServerConfig()

    async def main() -> None:
        listeners = open_listeners(config, Path(path), environ={})
        server = HttpServer(service, config)
        await server.start([item.socket for item in listeners])
        print("ready", flush=True)
        await asyncio.Event().wait()
    uvloop.run(main())


def _start_server(kind: str, path: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, __file__, f"--serve-{kind}", path], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"{kind} server did not start")
    return proc


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(path: str, seconds: float, connections: int, server_pid: int) -> dict[str, float]:
    # The clients import numpy before they start: on a loaded machine 16 of them take seconds to.
    start_at = time.time() + 2.0 + 0.25 * connections
    clients = [subprocess.Popen([sys.executable, __file__, "--client", path, str(start_at),
                                 str(start_at + seconds)], stdout=subprocess.PIPE, text=True)
               for _ in range(connections)]
    cpu_before = _cpu_seconds(server_pid)  # the server idles until start_at; the clients only import
    results = [json.loads(c.communicate()[0]) for c in clients]
    cpu = _cpu_seconds(server_pid) - cpu_before
    latencies = sorted(v for r in results for v in r["latencies_us"])
    rate = sum(r["count"] / r["seconds"] for r in results)
    return {"infer_per_s": rate, "p50_us": latencies[len(latencies) // 2],
            "p99_us": latencies[int(len(latencies) * 0.99)],
            "server_cpu_us": cpu * 1e6 / max(1, sum(r["count"] for r in results))}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp()
    canned_path, edged_path = os.path.join(workdir, "canned.sock"), os.path.join(workdir, "edged.sock")
    servers = [_start_server("canned", canned_path), _start_server("edged", edged_path)]
    try:
        canned, edged, many = [], [], []
        for run in range(args.runs):
            canned.append(_measure(canned_path, args.seconds, 1, servers[0].pid))
            edged.append(_measure(edged_path, args.seconds, 1, servers[1].pid))
            many.append(_measure(edged_path, args.seconds, args.concurrency, servers[1].pid))
            print(f"run {run + 1}: canned {canned[-1]}\n       edged c=1 {edged[-1]}\n"
                  f"       edged c={args.concurrency} {many[-1]}", flush=True)
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait()
    c, e, m = _median(canned), _median(edged), _median(many)
    print(f"\nmedians of {args.runs} runs x {args.seconds:g} s")
    for label, r in (("canned  c=1: ", c), ("edged   c=1: ", e), (f"edged   c={args.concurrency}:", m)):
        print(f"{label} {r['infer_per_s']:8.0f} infer/s  p50 {r['p50_us']:5.0f} us  p99 {r['p99_us']:5.0f} us  "
              f"server CPU {r['server_cpu_us']:5.1f} us/request")
    print(f"p50 difference edged - canned: {e['p50_us'] - c['p50_us']:.0f} us (target <= 75); "
          f"edged c=1 {e['infer_per_s']:.0f} infer/s (target >= 5000); "
          f"c={args.concurrency} / c=1: {m['infer_per_s'] / e['infer_per_s']:.2f}x (target >= 2)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        run_client(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve-canned":
        serve_canned(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve-edged":
        serve_edged(sys.argv[2])
    else:
        main()
