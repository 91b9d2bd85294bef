"""How long a liveness probe waits while one large BYTES infer request is served (docs/benchmarks.md).

Starts ``edged serve`` from the checkout given (``--checkout``, default this one) on a repository holding an ONNX
Identity model on a string tensor, sends one infer request of ``--elements`` BYTES elements (binary-data
extension in and out, JSON in and out with ``--json``, or a gRPC ModelInfer through tritonclient with ``--grpc``),
and meanwhile sends ``GET /v2/health/live`` on fresh
connections every 5 ms from another thread. Prints the infer time and the slowest probe.

    .venv/bin/python scripts/bench_bytes_stall.py --elements 5000000 [--json|--grpc] [--checkout /path/to/other]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from modelgen import add_identity_model  # noqa: E402


def http(path: str, method: str = "GET", body: bytes = b"", headers: tuple[tuple[str, int], ...] = ()) -> bytes:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(SOCKET)
    head = f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers) + "connection: close\r\n\r\n"
    sock.sendall(head.encode() + body)
    chunks = []
    while chunk := sock.recv(1 << 20):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


def body_for(count: int, as_json: bool) -> tuple[bytes, tuple[tuple[str, int], ...]]:
    items = [b"e%d" % (i % 1000) for i in range(count)]
    if as_json:
        doc = {"inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": [count],
                           "data": [item.decode() for item in items]}]}
        return json.dumps(doc).encode(), ()
    data = b"".join(struct.pack("<I", len(item)) + item for item in items)
    header = json.dumps({"inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": [count],
                                     "parameters": {"binary_data_size": len(data)}}],
                         "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}]}).encode()
    return header + data, (("inference-header-content-length", len(header)),)


def grpc_infer(path: Path, count: int) -> bytes:
    """ModelInfer of ``count`` BYTES elements through tritonclient; b"HTTP 200 " when the output came back whole."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    values = np.array([b"e%d" % (i % 1000) for i in range(count)], dtype=object)
    client = grpcclient.InferenceServerClient(f"unix://{path}")
    try:
        tensor = grpcclient.InferInput("INPUT", [count], "BYTES")
        tensor.set_data_from_numpy(values)
        result = client.infer("strings", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT")])
    finally:
        client.close()
    return b"gRPC 200 " if len(result.as_numpy("OUTPUT")) == count else b"gRPC wrong "


def main() -> None:
    global SOCKET
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=5_000_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--grpc", action="store_true")
    parser.add_argument("--checkout", type=Path, default=ROOT)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="edged-bytes-", dir="/tmp"))
    SOCKET = str(base / "edged.sock")
    add_identity_model(base / "models", "strings", "BYTES", max_batch=0)
    grpc = ["--grpc-socket", str(base / "grpc.sock")] if args.grpc else []
    daemon = subprocess.Popen([str(ROOT / ".venv" / "bin" / "edged"), "serve", "--model-repository",
                               str(base / "models"), "--socket", SOCKET, "--state-dir", str(base / "state"),
                               "--log-level", "warning", *grpc], env={**os.environ, "PYTHONPATH": str(args.checkout)})
    try:
        for _ in range(300):
            try:
                if b" 200 " in http("/v2/models/strings/ready").split(b"\r\n")[0]:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        body, headers = body_for(args.elements, args.json)
        send = (lambda: grpc_infer(base / "grpc.sock", args.elements)) if args.grpc else (
            lambda: http("/v2/models/strings/infer", "POST", body, headers))
        waits: list[float] = []
        done = threading.Event()

        def probe() -> None:
            while not done.is_set():
                start = time.monotonic()
                http("/v2/health/live")
                waits.append(time.monotonic() - start)
                time.sleep(0.005)

        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(0.2)
        start = time.monotonic()
        reply = send()
        took = time.monotonic() - start
        time.sleep(0.2)
        done.set()
        prober.join()
        form = "grpc" if args.grpc else "json" if args.json else "binary"
        print(f"elements={args.elements} form={form} body={len(body)} "
              f"status={reply.split(b' ', 2)[1].decode()} infer_s={took:.2f} probes={len(waits)} "
              f"probe_max_ms={max(waits) * 1000:.0f}")
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(base, ignore_errors=True)


SOCKET = ""

if __name__ == "__main__":
    main()
