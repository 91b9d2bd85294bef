"""HTTP and gRPC side by side in one run, with perf_analyzer against one spawned daemon.

Usage: python scripts/bench_grpc.py [PERF_ANALYZER]  (default .cache/perf_analyzer/perf_analyzer)
       python scripts/bench_grpc.py --ab BASE_CHECKOUT [--rounds N] [--streaming] [PERF_ANALYZER]

tiny_mlp at concurrency 1 and 4 over both protocols, then camera_frame ([1,1080,1920,3] UINT8) at concurrency 1
with the frame in the message body and in system shared memory. Scenarios alternate (HTTP, gRPC, ...) so that
machine load hits both alike. Prints one line per scenario: infer/s, p50 and p99 in microseconds.

``--ab``: two daemons, one running BASE_CHECKOUT's edged and one this checkout's, both serving gRPC; for
tiny_mlp c1 and c4 perf_analyzer ``-i grpc`` alternates between them, and each run reports the daemon's CPU
per call: its user+system time from /proc/PID/stat over the model's inference_count (the statistics route),
which machine load moves far less than infer/s. With ``--streaming`` perf_analyzer calls ModelStreamInfer (its
``--streaming``: one bidirectional stream per concurrent client) instead of ModelInfer.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEY = ("edged-key", "bench")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_ready(port: int, deadline_s: float = 120.0) -> None:
    """Poll the HTTP readiness route (models loaded) against a deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the daemon was not ready on port {port}")


def _run(perf: str, protocol: str, port: int, model: str, concurrency: int, shm: str, work: Path,
         streaming: bool = False) -> str:
    out = work / f"{protocol}-{model}-{concurrency}-{shm}.csv"
    done = subprocess.run([perf, "-m", model, "-i", protocol, "-u", f"127.0.0.1:{port}", "--concurrency-range",
                    str(concurrency), "--measurement-interval", "3000", "--stability-percentage", "1000",
                    "--max-trials", "3", "--shared-memory", shm, "-H", f"{KEY[0]}:{KEY[1]}", "-f", str(out),
                    *(["--streaming"] if streaming else [])],
                          check=False, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"perf_analyzer failed ({protocol} {model}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    row = next(csv.DictReader(out.open()))
    return (f"{protocol:4} {model:12} c{concurrency} shm={shm:6} {float(row['Inferences/Second']):8.1f} infer/s  "
            f"p50 {int(row['p50 latency']):7d} us  p99 {int(row['p99 latency']):7d} us")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _inferences(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/tiny_mlp/stats", timeout=10) as answer:
        stats = json.loads(answer.read())
    return int(stats["model_stats"][0]["inference_count"])


def _start(checkout: Path, work: Path, name: str) -> tuple[subprocess.Popen[bytes], int, int]:
    http, grpc = _free_port(), _free_port()
    home = work / name
    home.mkdir()
    (home / "edged.toml").write_text(f'[server]\nhttp_port = {http}\ngrpc_port = {grpc}\n[telemetry]\n'
                                     'source = "off"\n')
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    daemon = subprocess.Popen([sys.executable, "-m", "edged", "serve", "--config", str(home / "edged.toml"),
                               "--socket", str(home / "edged.sock"), "--state-dir", str(home / "state")],
                              env=env, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return daemon, http, grpc


def ab(perf: str, base: Path, rounds: int, streaming: bool) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        daemons = {"base": _start(base, work, "base"), "new": _start(ROOT, work, "new")}
        try:
            for _, http, _ in daemons.values():
                _wait_ready(http)
            for round_ in range(rounds):
                for concurrency in (1, 4):
                    order = ("base", "new") if round_ % 2 == 0 else ("new", "base")
                    for name in order:
                        daemon, http, grpc = daemons[name]
                        cpu, count = _cpu_s(daemon.pid), _inferences(http)
                        line = _run(perf, "grpc", grpc, "tiny_mlp", concurrency, "none", work, streaming)
                        per_call = (_cpu_s(daemon.pid) - cpu) / max(1, _inferences(http) - count) * 1e6
                        print(f"round {round_ + 1} {name:4} {line}  daemon CPU {per_call:6.0f} us/call", flush=True)
        finally:
            for daemon, _, _ in daemons.values():
                daemon.terminate()
                daemon.wait(30)
    return 0


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--ab"]:
        base = Path(args[1])
        rounds = int(args[3]) if args[2:3] == ["--rounds"] else 2
        rest = args[4:] if args[2:3] == ["--rounds"] else args[2:]
        streaming = rest[:1] == ["--streaming"]
        rest = rest[1:] if streaming else rest
        perf = rest[0] if rest else str(ROOT / ".cache" / "perf_analyzer" / "perf_analyzer")
        return ab(perf, base, rounds, streaming)
    perf = args[0] if args else str(ROOT / ".cache" / "perf_analyzer" / "perf_analyzer")
    http, grpc = _free_port(), _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "edged.toml").write_text(f'[server]\nhttp_port = {http}\ngrpc_port = {grpc}\n[telemetry]\n'
                                         f'source = "off"\n[server.tcp_restricted]\nshared-memory = '
                                         f'"{KEY[0]}={KEY[1]}"\n')
        daemon = subprocess.Popen([sys.executable, "-m", "edged", "serve", "--config", str(work / "edged.toml"),
                                   "--socket", str(work / "edged.sock"), "--state-dir", str(work / "state")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_ready(http)
            for model, concurrency, shm in [("tiny_mlp", 1, "none"), ("tiny_mlp", 4, "none"),
                                            ("camera_frame", 1, "none"), ("camera_frame", 1, "system")]:
                for protocol, port in (("http", http), ("grpc", grpc)):
                    print(_run(perf, protocol, port, model, concurrency, shm, work), flush=True)
        finally:
            daemon.terminate()
            daemon.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
