"""Measure what one large JSON infer body costs the daemon: peak and retained RSS, and the event-loop stall
another client sees, for the code at a baseline git revision and for the working tree, side by side.

Each scenario runs against a fresh daemon (``python -m edged serve``, telemetry off) serving tiny_mlp (a
fixed [-1, 64] input, at most 64 rows) and open_mlp (the same network with open dims, max_batch_size 0):

- ``too-large``: 5M FP32 values as JSON (about 55 MB) to tiny_mlp, which can take 4096 values;
- ``accepted``: the same body to open_mlp as [78125, 64], which runs;
- ``four-accepted``: four of those at once, on four connections.

While a scenario runs, a second client sends ``GET /v2/health/ready`` on a keep-alive connection in a loop;
its latency percentiles show how long the loop stalled. Peak is VmHWM less VmRSS before the scenario.

    python scripts/bench_big_body.py [--baseline dd4723b] [--values 5000000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from modelgen import add_model, mlp_weights  # noqa: E402

OPEN_MLP = """name: "open_mlp"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "input", data_type: TYPE_FP32, dims: [ -1, 64 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ -1, 10 ] } ]
"""


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(120)
    sock.connect(path)
    return sock


def _exchange(sock: socket.socket, request: bytes) -> int:
    """Send one request, read its response (Content-Length framed); the status."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed before a response")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        body += chunk
    return int(head.split(b" ", 2)[1])


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


class Daemon:
    def __init__(self, tree: Path, repo: Path, workdir: Path) -> None:
        workdir.mkdir(parents=True)
        self.socket = str(workdir / "edged.sock")
        (workdir / "edged.toml").write_text('[telemetry]\nsource = "off"\n')
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edged", "serve", "--socket", self.socket, "--state-dir", str(workdir / "s"),
             "--config", str(workdir / "edged.toml"), "--model-repository", str(repo)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(tree))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with _connect(self.socket) as sock:
                    if _exchange(sock, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n") == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("daemon not ready")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def _probe(path: str, stop: threading.Event, latencies: list[float]) -> None:
    with _connect(path) as sock:
        while not stop.is_set():
            started = time.perf_counter()
            _exchange(sock, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            latencies.append(time.perf_counter() - started)
            time.sleep(0.002)


def _scenario(daemon: Daemon, requests: list[bytes]) -> dict[str, float | str]:
    pid = daemon.process.pid
    before = _status_kib(pid, "VmRSS")
    stop = threading.Event()
    latencies: list[float] = []
    prober = threading.Thread(target=_probe, args=(daemon.socket, stop, latencies))
    prober.start()
    time.sleep(0.2)
    statuses: list[int] = []
    started = time.perf_counter()
    senders = [threading.Thread(target=lambda r=r: statuses.append(_exchange(_connect(daemon.socket), r)))
               for r in requests]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    elapsed = time.perf_counter() - started
    stop.set()
    prober.join()
    time.sleep(0.5)
    ordered = sorted(latencies)
    return {"status": "/".join(str(s) for s in sorted(statuses)), "seconds": elapsed,
            "peak_mib": (_status_kib(pid, "VmHWM") - before) / 1024,
            "held_after_mib": (_status_kib(pid, "VmRSS") - before) / 1024,
            "ready_p50_ms": statistics.median(ordered) * 1e3,
            "ready_p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
            "ready_max_ms": ordered[-1] * 1e3}


def _body(values: int, rows_of: int) -> bytes:
    data = np.random.default_rng(0).random(values, dtype=np.float32)
    doc = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [values // rows_of, rows_of], "data": data}]}
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def _request(model: str, body: bytes) -> bytes:
    return (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % (model.encode(), len(body))) + body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="dd4723b", help="git revision measured as 'before'")
    parser.add_argument("--values", type=int, default=5_000_000)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="edged-bb-", dir="/tmp"))
    try:
        baseline = scratch / "baseline"
        baseline.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline, "edged"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
        repo = scratch / "repo"
        shutil.copytree(ROOT / "models" / "tiny_mlp", repo / "tiny_mlp")
        add_model(repo, "open_mlp", OPEN_MLP, {1: mlp_weights()})
        body = _body(args.values, 64)
        print(f"body: {len(body) / 1e6:.1f} MB of JSON, {args.values} FP32 values")
        scenarios = {"too-large": [_request("tiny_mlp", body)], "accepted": [_request("open_mlp", body)],
                     "four-accepted": [_request("open_mlp", body)] * 4}
        for name, requests in scenarios.items():
            for label, tree in (("before", baseline), ("after", ROOT)):
                daemon = Daemon(tree, repo, scratch / f"{name}-{label}")
                try:
                    result = _scenario(daemon, requests)
                finally:
                    daemon.stop()
                print(f"{name:14} {label:6} " + " ".join(
                    f"{key}={value:.1f}" if isinstance(value, float) else f"{key}={value}"
                    for key, value in result.items()), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
