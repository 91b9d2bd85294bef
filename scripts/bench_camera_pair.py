"""Camera frames in the body: two edged code trees side by side, server CPU and client p50 per request.

Each tree runs as a real daemon (``python -m edged serve``, that tree on PYTHONPATH, telemetry off) serving
models/camera_frame on a private Unix socket and a loopback TCP port. One client alternates requests between
the two daemons, one 1080p UINT8 frame (6.2 MB, binary body) each, concurrency 1, so the drift of a shared
machine's load hits both alike; first over the Unix sockets, then over TCP, ``--rounds`` times. Server CPU is
the daemon's user + system time from /proc divided by the requests it answered in that phase, for the whole
process and for its loop thread. Run it a second time with the trees swapped.

    .venv/bin/python scripts/bench_camera_pair.py BASE_TREE NEW_TREE [--seconds 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from edged.protocol import encode_request

MODEL = "camera_frame"


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


class TcpConnection(http.client.HTTPConnection):
    """Loopback TCP without Nagle: http.client sends a large body after its head in a second write, and Nagle's
    wait for the ACK of the head, which the server delays, would be measured as the server's time."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU of a process, or of one of its threads (the main thread, where the loop runs)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_calls(pid: int) -> int:
    """read() and recv() calls the process's loop thread made so far (syscr of /proc/PID/task/PID/io)."""
    for line in Path(f"/proc/{pid}/task/{pid}/io").read_text().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    raise SystemExit(f"no syscr in /proc/{pid}/task/{pid}/io")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start(tree: Path, work: Path, index: int) -> tuple[subprocess.Popen[bytes], str, int]:
    folder = work / str(index)
    (folder / "models").mkdir(parents=True)
    os.symlink(tree.resolve() / "models" / MODEL, folder / "models" / MODEL)  # the daemon copies nothing
    config = folder / "edged.toml"
    port = free_port()
    config.write_text(f'[server]\nhttp_port = {port}\n\n[telemetry]\nsource = "off"\n')
    path = str(folder / "edged.sock")
    process = subprocess.Popen([sys.executable, "-m", "edged", "serve", "--config", str(config), "--socket", path,
                                "--model-repository", str(folder / "models"), "--state-dir", str(folder),
                                "--log-level", "warning"], cwd=tree,
                               env={**os.environ, "PYTHONPATH": str(tree.resolve())})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            conn = UnixConnection(path)
            conn.request("GET", f"/v2/models/{MODEL}/ready")
            if conn.getresponse().status == 200:
                return process, path, port
        except OSError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the daemon of {tree} was not ready within 120 s")


def one(conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str]) -> float:
    began = time.perf_counter()
    conn.request("POST", f"/v2/models/{MODEL}/infer", body, headers)
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise SystemExit(f"HTTP {response.status}")
    return (time.perf_counter() - began) * 1e3


def phase(servers: list[tuple[subprocess.Popen[bytes], http.client.HTTPConnection]], body: bytes,
          headers: dict[str, str], seconds: float) -> list[tuple[float, float, float, float, int]]:
    """(client p50 ms, server CPU ms per request, its loop thread's, its reads per request, requests) per
    server, requests alternating
    between them. The model runs on the engine's worker and a body this large is decoded on the decoding thread:
    the loop thread's CPU is what reading, parsing, dispatching and answering cost."""
    for _ in range(5):
        for _, conn in servers:
            one(conn, body, headers)
    before = [cpu_seconds(process.pid) for process, _ in servers]
    loop_before = [cpu_seconds(process.pid, process.pid) for process, _ in servers]
    reads_before = [read_calls(process.pid) for process, _ in servers]
    latencies: list[list[float]] = [[] for _ in servers]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for index, (_, conn) in enumerate(servers):
            latencies[index].append(one(conn, body, headers))
    return [(statistics.median(own), (cpu_seconds(process.pid) - cpu) * 1e3 / len(own),
             (cpu_seconds(process.pid, process.pid) - loop) * 1e3 / len(own),
             (read_calls(process.pid) - reads) / len(own), len(own))
            for (process, _), cpu, loop, reads, own in zip(servers, before, loop_before, reads_before, latencies,
                                                           strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs=2, type=Path)
    parser.add_argument("--seconds", type=float, default=6.0, help="per transport and round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    frame = np.random.default_rng(0).integers(0, 256, (1, 1080, 1920, 3), dtype=np.uint8)
    body, header_length = encode_request({"frame": frame})
    headers = {"Inference-Header-Content-Length": str(header_length), "Content-Type": "application/octet-stream"}
    work = Path(tempfile.mkdtemp(prefix="edged-camera-pair-", dir="/tmp"))
    daemons = [start(tree, work, index) for index, tree in enumerate(args.trees)]
    try:
        print(f"{'round':<6} {'transport':<10} " + "  ".join(f"{t.name or str(t):>28}" for t in args.trees))
        for number in range(args.rounds):
            for transport in ("uds", "tcp"):
                conns: list[http.client.HTTPConnection] = [
                    UnixConnection(path) if transport == "uds" else TcpConnection("127.0.0.1", port, timeout=60)
                    for _, path, port in daemons]
                results = phase([(process, conn) for (process, _, _), conn in zip(daemons, conns, strict=True)],
                                body, headers,
                                args.seconds)
                cells = "  ".join(f"p50 {p50:6.2f} ms, CPU {cpu:6.2f} (loop {loop:5.2f}) ms/req, {reads:5.0f} reads"
                                  for p50, cpu, loop, reads, _ in results)
                print(f"{number + 1:<6} {transport:<10} {cells}  ({results[0][4]} requests each)", flush=True)
                for conn in conns:
                    conn.close()
    finally:
        for process, _, _ in daemons:
            process.terminate()
            process.wait(20)


if __name__ == "__main__":
    main()
