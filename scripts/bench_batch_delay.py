"""Measure what max_queue_delay_microseconds costs a lone request, and that batches still fill under load.

One edged HttpServer process on a Unix socket serves tiny_mlp three times, identical but for the batching delay
(0, 100 and 200 µs). One client alternates between them request by request (concurrency 1, so drift in the
machine's load hits all three alike) and reports each model's p50 latency and the overshoot: p50(D) - p50(0) - D.
Then 16 client processes load the 200 µs model and the mean batch size is read from its statistics.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_batch_delay.py [--seconds 10] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DELAYS_US = (0, 100, 200)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


def _request() -> tuple[bytes, dict[str, str]]:
    import numpy as np

    from edged.protocol import encode_request
    body, header_length = encode_request({"input": np.random.default_rng(0).random((1, 64), np.float32)})
    return body, {"Inference-Header-Content-Length": str(header_length or 0),
                  "Content-Type": "application/octet-stream"}


def run_client(path: str, models: list[str], seconds: float) -> None:
    body, headers = _request()
    conn = _UnixConnection(path)
    latencies: dict[str, list[int]] = {model: [] for model in models}
    clock = time.perf_counter_ns
    end = clock() + int(seconds * 1e9)
    while clock() < end:
        for model in models:
            t0 = clock()
            conn.request("POST", f"/v2/models/{model}/infer", body, headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise SystemExit(f"{model}: HTTP {response.status}")
            latencies[model].append(clock() - t0)
    print(json.dumps({model: [v // 1000 for v in values] for model, values in latencies.items()}))


def serve(path: str) -> None:
    import uvloop

    from edged.config import ModelsConfig, ServerConfig
    from edged.engine import InferenceService
    from edged.serving import HttpServer, open_listeners

    repo = Path(tempfile.mkdtemp())
    source = (ROOT / "models" / "tiny_mlp" / "config.pbtxt").read_text()
    for delay in DELAYS_US:
        name = f"tiny_d{delay}"
        (repo / name / "1").mkdir(parents=True)
        # a copy: a model file symlinked from outside its model folder is refused (edged.repository.confine)
        shutil.copyfile(ROOT / "models" / "tiny_mlp" / "1" / "model.onnx", repo / name / "1" / "model.onnx")
        config = source.replace('"tiny_mlp"', f'"{name}"').replace(
            "dynamic_batching { }", f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}")
        (repo / name / "config.pbtxt").write_text(config)
    service = InferenceService(repo, ModelsConfig())
    service.start()
    config = ServerConfig()

    async def main() -> None:
        listeners = open_listeners(config, Path(path), environ={})
        server = HttpServer(service, config)
        await server.start([item.socket for item in listeners])
        print("ready", flush=True)
        await asyncio.Event().wait()
    uvloop.run(main())


def _clients(path: str, models: list[str], seconds: float, count: int) -> list[dict[str, list[int]]]:
    procs = [subprocess.Popen([sys.executable, __file__, "--client", path, ",".join(models), str(seconds)],
                              stdout=subprocess.PIPE, text=True) for _ in range(count)]
    return [json.loads(proc.communicate()[0]) for proc in procs]


def _batch_size(path: str, model: str) -> tuple[int, int]:
    conn = _UnixConnection(path)
    conn.request("GET", f"/v2/models/{model}/stats")
    stats = json.loads(conn.getresponse().read())["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    path = str(Path(tempfile.mkdtemp()) / "edged.sock")
    server = subprocess.Popen([sys.executable, __file__, "--serve", path], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("server did not start")
        models = [f"tiny_d{delay}" for delay in DELAYS_US]
        lone = _clients(path, models, args.seconds, 1)[0]
        p50 = {model: statistics.median(values) for model, values in lone.items()}
        base = p50["tiny_d0"]
        for delay, model in zip(DELAYS_US, models, strict=True):
            print(f"c=1  {model}: p50 {p50[model]:6.0f} us over {len(lone[model])} requests; "
                  f"overshoot p50 - p50(D=0) - D = {p50[model] - base - delay:5.0f} us")
        loaded = models[-1]
        before = _batch_size(path, loaded)
        _clients(path, [loaded], args.seconds / 2, args.concurrency)
        after = _batch_size(path, loaded)
        requests, executions = after[0] - before[0], after[1] - before[1]
        print(f"c={args.concurrency} {loaded}: {requests} requests in {executions} executions, mean batch "
              f"{requests / max(1, executions):.1f}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        run_client(sys.argv[2], sys.argv[3].split(","), float(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        main()
