"""HTTP and gRPC side by side in one run, with perf_analyzer against one spawned daemon.

Usage: python scripts/bench_grpc.py [PERF_ANALYZER]  (default .cache/perf_analyzer/perf_analyzer)

tiny_mlp at concurrency 1 and 4 over both protocols, then camera_frame ([1,1080,1920,3] UINT8) at concurrency 1
with the frame in the message body and in system shared memory. Scenarios alternate (HTTP, gRPC, ...) so that
machine load hits both alike. Prints one line per scenario: infer/s, p50 and p99 in microseconds.
"""

from __future__ import annotations

import csv
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


def _run(perf: str, protocol: str, port: int, model: str, concurrency: int, shm: str, work: Path) -> str:
    out = work / f"{protocol}-{model}-{concurrency}-{shm}.csv"
    done = subprocess.run([perf, "-m", model, "-i", protocol, "-u", f"127.0.0.1:{port}", "--concurrency-range",
                    str(concurrency), "--measurement-interval", "3000", "--stability-percentage", "1000",
                    "--max-trials", "3", "--shared-memory", shm, "-H", f"{KEY[0]}:{KEY[1]}", "-f", str(out)],
                          check=False, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"perf_analyzer failed ({protocol} {model}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    row = next(csv.DictReader(out.open()))
    return (f"{protocol:4} {model:12} c{concurrency} shm={shm:6} {float(row['Inferences/Second']):8.1f} infer/s  "
            f"p50 {int(row['p50 latency']):7d} us  p99 {int(row['p99 latency']):7d} us")


def main() -> int:
    perf = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / ".cache" / "perf_analyzer" / "perf_analyzer")
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
