"""Measure what max_queue_delay_microseconds costs a lone request, and how full batches get at concurrency 16.

One edged process (HttpServer on a Unix socket and loopback TCP, GrpcServer on the next port) serves copies of
tiny_mlp that differ only in their batching: tiny_d0, tiny_d100, tiny_d200 (max_batch_size 64, delays 0, 100,
200 µs) for the lone-request overshoot, and tiny_b16_d<D> (max_batch_size 16) for each ``--delays`` D for the
batch sizes at concurrency 16.

- c=1: one client alternates between tiny_d0/100/200 request by request (so drift in the machine's load hits all
  three alike) and reports each model's p50 latency and the overshoot: p50(D) - p50(0) - D.
- c=16, for each client kind of ``--clients`` and each delay, the mean batch (inference_count /
  execution_count from the model's statistics, over that run only):
  ``procs``: 16 processes with ``http.client`` on the Unix socket (they need the same cores as the server);
  ``asyncio``: one process, 16 connections on loopback TCP, each sending its next request once its answer is in;
  ``pa``: perf_analyzer (C++, one process, 16 threads) over loopback TCP, ``--concurrency-range 16``;
  ``pa-grpc``: the same over gRPC (``-i grpc``, the server's gRPC front end on the next port).

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_batch_delay.py [--seconds 10]
        [--clients procs asyncio burst pa pa-grpc] [--delays 200 1000 5000] [--skip-c1] [--trees /tmp/base . --rounds 4]
        [--triton]
    PYTHONPATH=$PWD .venv/bin/python scripts/bench_batch_delay.py --lateness

``--lateness`` only measures how late this machine's timed waits end (the thread's timer slack set to 1 µs, as
edged's waiting threads have it): what edged.engine.delay_wait spins to cover, p50/p90/p99 per wait length.

``--triton`` also starts NVIDIA Triton 2.51 (the nvidia-pytriton wheel of scripts/bench_vs_triton.py, its Python
backend running onnxruntime) on the same tiny_b16_d<D> models, whose ``model.py`` runs each batch Triton's
dynamic batcher forms as one onnxruntime call, and measures it in the same alternation with the TCP clients
(``asyncio``, ``burst``, ``pa``, ``pa-grpc``; ``procs`` and the c=1 part use edged's Unix socket and skip it):
the reference for how full a batch any server gets from these clients on this machine.

``burst`` is the asyncio client in rounds: every connection sends at once, the next round when all answers are
in (requests that arrive together, as the best case). ``--trees`` runs one server per edged checkout (its
PYTHONPATH) and measures them in alternation, the order reversed every round, so the machine's drift hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LONE_DELAYS_US = (0, 100, 200)
PERF_ANALYZER = ROOT / ".cache" / "perf_analyzer" / "perf_analyzer"


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


# --- the asyncio client: one process, `concurrency` connections ------------------------------------------
async def _one_connection(port: int, request: bytes, end: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    loop = asyncio.get_running_loop()
    while loop.time() < end:
        writer.write(request)
        await _read_response(reader)
        counts[0] += 1
    writer.close()


async def _read_response(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"asyncio client: {head[:200]!r}")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    await reader.readexactly(length)


async def _bursts(port: int, request: bytes, end: float, concurrency: int) -> int:
    """Rounds: all connections send at once, the next round starts when every answer is in."""
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]
    loop = asyncio.get_running_loop()
    count = 0
    while loop.time() < end:
        for _, writer in connections:
            writer.write(request)
        await asyncio.gather(*(_read_response(reader) for reader, _ in connections))
        count += concurrency
    return count


async def _asyncio_clients(port: int, model: str, seconds: float, concurrency: int, burst: bool) -> int:
    body, headers = _request()
    head = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    request = head.encode() + b"\r\n" + body
    end = asyncio.get_running_loop().time() + seconds
    if burst:
        return await _bursts(port, request, end, concurrency)
    counts = [0]
    await asyncio.gather(*(_one_connection(port, request, end, counts) for _ in range(concurrency)))
    return counts[0]


def run_asyncio_client(port: int, model: str, seconds: float, concurrency: int, burst: bool) -> None:
    import uvloop
    print(json.dumps(uvloop.run(_asyncio_clients(port, model, seconds, concurrency, burst))))


# --- the server ----------------------------------------------------------------------------------------
def _model(repo: Path, name: str, max_batch: int, delay_us: int) -> None:
    source = (ROOT / "models" / "tiny_mlp" / "config.pbtxt").read_text()
    (repo / name / "1").mkdir(parents=True)
    # a copy: a model file symlinked from outside its model folder is refused (edged.repository.confine)
    shutil.copyfile(ROOT / "models" / "tiny_mlp" / "1" / "model.onnx", repo / name / "1" / "model.onnx")
    config = source.replace('"tiny_mlp"', f'"{name}"').replace("max_batch_size: 64", f"max_batch_size: {max_batch}")
    config = config.replace("dynamic_batching { }", f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}")
    (repo / name / "config.pbtxt").write_text(config)


def serve(path: str, port: int, grpc_port: int, delays: list[int]) -> None:
    import uvloop

    from edged.config import ModelsConfig, ServerConfig
    from edged.engine import InferenceService
    from edged.grpcapi import GrpcServer
    from edged.serving import HttpServer, open_listeners

    repo = Path(tempfile.mkdtemp())
    for delay in LONE_DELAYS_US:
        _model(repo, f"tiny_d{delay}", 64, delay)
    for delay in delays:
        _model(repo, f"tiny_b16_d{delay}", 16, delay)
    service = InferenceService(repo, ModelsConfig())
    service.start()
    config = ServerConfig(http_port=port, grpc_port=grpc_port)

    async def main() -> None:
        listeners = open_listeners(config, Path(path), environ={})
        server = HttpServer(service, config)
        await server.start([item.socket for item in listeners])
        grpc = GrpcServer(service, config, server.shared_memory)  # perf_analyzer -i grpc (the pa-grpc client)
        await grpc.start(server.body_budget)
        print("ready", flush=True)
        await asyncio.Event().wait()
    uvloop.run(main())


# --- Triton (--triton) ----------------------------------------------------------------------------------
# The stub embeds the system's libpython and does not see the venv (as in bench_vs_triton.py). A batching model:
# the requests of one batch are concatenated and run as one onnxruntime call, as edged's engine runs a batch.
def _triton_batch_model_py() -> str:
    from bench_vs_triton import TRITON_MODEL_HEAD
    numpy = "import numpy as np  # noqa: E402\n"  # for the concatenation of a batch's requests
    head = TRITON_MODEL_HEAD.replace("import onnxruntime as ort", numpy + "import onnxruntime as ort")
    return head + """    def execute(self, requests):
        feeds = [[pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.inputs] for r in requests]
        merged = {{name: np.concatenate([feed[i] for feed in feeds]) for i, name in enumerate(self.inputs)}}
        values = self.session.run(None, merged)
        responses, offset = [], 0
        for feed in feeds:
            rows = feed[0].shape[0]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, value[offset:offset + rows]) for name, value in zip(self.outputs, values)]))
            offset += rows
        return responses
"""


def _start_triton(delays: list[int]) -> tuple[subprocess.Popen[bytes], tuple[str | None, int]]:
    from bench_vs_triton import TRITON_VENV, Ports, ensure_triton_venv, start_triton
    install = ensure_triton_venv(TRITON_VENV)
    work = Path(tempfile.mkdtemp())
    repo = work / "models"
    repo.mkdir()
    names = [f"tiny_b16_d{delay}" for delay in delays]
    for delay, name in zip(delays, names, strict=True):
        _model(repo, name, 16, delay)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace('platform: "onnxruntime_onnx"', 'backend: "python"'))
        (repo / name / "1" / "model.py").write_text(_triton_batch_model_py().format(site=str(install.site)))
    backends = work / "backends" / "python"
    shutil.copytree(install.backend_files, backends, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(install.stub, backends / "triton_python_backend_stub")
    port = _free_port_pair()
    log = work / "triton.log"
    server = start_triton(install, repo, backends.parent, Ports(port, port + 1), log)
    deadline = time.monotonic() + 180
    while names:
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"Triton did not get ready; its log {log}:\n" + log.read_text(errors="replace")[-3000:])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", f"/v2/models/{names[0]}/ready")
            if conn.getresponse().status == 200:
                names.pop(0)
                continue
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    return server, (None, port)


def lateness(waits_us: tuple[int, ...] = (20, 50, 100, 200, 400), count: int = 2000) -> None:
    from edged.engine.worker_pool import precise_timers
    precise_timers()
    lock = threading.Lock()
    lock.acquire()
    for wait_us in waits_us:
        late = sorted(_late_ns(lock, wait_us) for _ in range(count))
        print(f"timed wait of {wait_us:3} µs ends late by p50 {late[count // 2] / 1000:.0f} µs, "
              f"p90 {late[count * 9 // 10] / 1000:.0f} µs, p99 {late[count * 99 // 100] / 1000:.0f} µs")


def _late_ns(lock: threading.Lock, wait_us: int) -> int:
    start = time.perf_counter_ns()
    lock.acquire(True, wait_us / 1e6)  # never free: it times out, as a batching delay's wait does
    return time.perf_counter_ns() - start - wait_us * 1000


# --- the driver ----------------------------------------------------------------------------------------
def _clients(path: str, models: list[str], seconds: float, count: int) -> list[dict[str, list[int]]]:
    command = [sys.executable, __file__, "--client", path, ",".join(models), str(seconds)]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    return [json.loads(proc.communicate()[0]) for proc in procs]


def _counts(server: tuple[str | None, int], model: str) -> tuple[int, int]:
    path, port = server
    conn = _UnixConnection(path) if path else http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", f"/v2/models/{model}/stats")
    stats = json.loads(conn.getresponse().read())["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def _load(kind: str, path: str, port: int, model: str, seconds: float, concurrency: int) -> None:
    if kind == "procs":
        _clients(path, [model], seconds, concurrency)
    elif kind in ("asyncio", "burst"):
        subprocess.run([sys.executable, __file__, "--asyncio-client", str(port), model,
                        str(seconds), str(concurrency), kind], check=True, stdout=subprocess.DEVNULL)
    else:  # pa: perf_analyzer over HTTP, pa-grpc: over gRPC (HTTP/2: several requests in one read)
        protocol, target = ("grpc", port + 1) if kind == "pa-grpc" else ("http", port)
        subprocess.run([str(PERF_ANALYZER), "-m", model, "-i", protocol,
                        "-u", f"127.0.0.1:{target}",
                        "--concurrency-range", str(concurrency), "--measurement-interval",
                        str(int(seconds * 1000)), "--stability-percentage", "1000", "--max-trials", "3"],
                       check=True, stdout=subprocess.DEVNULL, timeout=120)


def _lone(path: str, seconds: float) -> dict[int, float]:
    """Overshoot p50(D) - p50(D=0) - D by delay, one client alternating between the delays."""
    models = [f"tiny_d{delay}" for delay in LONE_DELAYS_US]
    lone = _clients(path, models, seconds, 1)[0]
    p50 = {model: statistics.median(values) for model, values in lone.items()}
    return {delay: p50[model] - p50["tiny_d0"] - delay for delay, model in zip(LONE_DELAYS_US, models, strict=True)}


def _mean_batch(kind: str, server: tuple[str | None, int], delay: int, seconds: float, concurrency: int) -> float:
    path, port = server
    model = f"tiny_b16_d{delay}"
    before = _counts(server, model)
    _load(kind, path or "", port, model, seconds, concurrency)
    after = _counts(server, model)
    return (after[0] - before[0]) / max(1, after[1] - before[1])


def _free_port_pair() -> int:
    """A port P with P + 1 also free (HTTP on P, gRPC on P + 1)."""
    while True:
        with socket.socket() as probe, socket.socket() as second:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return int(port)


def _start(tree: str, delays: list[int]) -> tuple[subprocess.Popen[str], tuple[str, int]]:
    path = str(Path(tempfile.mkdtemp()) / "edged.sock")
    port = _free_port_pair()
    server = subprocess.Popen([sys.executable, __file__, "--serve", path, str(port),
                               str(port + 1), *map(str, delays)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": tree})
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":
        raise SystemExit(f"the server of {tree} did not start")
    return server, (path, port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--clients", nargs="*", choices=("procs", "asyncio", "burst", "pa", "pa-grpc"),
                        default=["procs"])
    parser.add_argument("--delays", nargs="+", type=int, default=[200])
    parser.add_argument("--skip-c1", action="store_true")
    parser.add_argument("--trees", nargs="+", default=[os.environ.get("PYTHONPATH", str(ROOT))],
                        help="edged checkouts to compare, one server each, measured in alternation")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over the trees, the order reversed each round")
    parser.add_argument("--triton", action="store_true", help="also Triton 2.51 (Python backend), TCP clients only")
    args = parser.parse_args()
    started: list[tuple[subprocess.Popen[Any], tuple[str | None, int]]] = [_start(tree, args.delays)
                                                                          for tree in args.trees]
    names = list(args.trees)
    if args.triton:
        started.append(_start_triton(args.delays))
        names.append("triton")
    servers = {name: address for name, (_, address) in zip(names, started, strict=True)}
    results: dict[tuple[str, str], list[float]] = {}
    try:
        for round_index in range(args.rounds):
            order = names if round_index % 2 == 0 else names[::-1]
            for tree in order if not args.skip_c1 else []:
                path = servers[tree][0]
                if path is None:
                    continue  # Triton: no Unix socket
                for delay, overshoot in _lone(path, args.seconds).items():
                    results.setdefault((f"c=1 overshoot D={delay}", tree), []).append(overshoot)
            for kind in args.clients:
                for delay in args.delays:
                    for tree in order:
                        if servers[tree][0] is None and kind == "procs":
                            continue  # Triton: the procs clients speak to a Unix socket
                        batch = _mean_batch(kind, servers[tree], delay, args.seconds / 2, args.concurrency)
                        label = f"c={args.concurrency} {kind} D={delay} mean batch"
                        results.setdefault((label, tree), []).append(batch)
            print(f"round {round_index + 1} done, load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        for server, _ in started:
            server.terminate()
            server.wait()
    for (label, tree), values in results.items():
        print(f"{label:34} {tree}: " + " ".join(f"{value:.1f}" for value in values))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        run_client(sys.argv[2], sys.argv[3].split(","), float(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--asyncio-client":
        run_asyncio_client(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "burst")
    elif len(sys.argv) > 1 and sys.argv[1] == "--lateness":
        lateness()
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), [int(value) for value in sys.argv[5:]])
    else:
        main()
