"""The real daemon's memory after large chunked request bodies: they are held within the body limits and given
back once answered, as bodies with a Content-Length are.

A chunked body once arrived as hundreds of parser pieces, each a heap block of its own, that glibc could not give
back once freed: every 40-70 MB body, refused or served, left the daemon's RSS some 60 MiB higher, for good.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

from integration.edged_daemon import start_daemon
from modelgen import BUNDLED_MODELS

MIB = 1024 * 1024
MAX_BODY = 32 * MIB
BODIES = 20
RSS_GROWTH_LIMIT_KIB = 100 * 1024  # on the bug: ~30 MiB a body, 600 MiB over the 20


def _send_chunked(path: str, target: bytes, mib: int) -> bytes:
    """POST ``mib`` MiB of spaces as 1 MiB chunks; the status line of the answer."""
    chunk = b"%x\r\n%s\r\n" % (MIB, b" " * MIB)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" % target)
        try:
            for _ in range(mib):
                sock.sendall(chunk)
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused at the limit: the daemon answered and closed while the rest was on its way
        answer = b""
        while b"\r\n" not in answer:
            piece = sock.recv(4096)
            if not piece:
                break
            answer += piece
        return answer.split(b"\r\n", 1)[0]


def test_large_chunked_bodies_refused_or_served_do_not_grow_rss(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    shutil.copytree(BUNDLED_MODELS / "tiny_mlp", repo / "tiny_mlp")
    workdir = Path(tempfile.mkdtemp(prefix="edged-chk-", dir="/tmp"))  # AF_UNIX paths: 107 bytes at most
    config = f'[telemetry]\nsource = "off"\n\n[server]\nmax_body_bytes = {MAX_BODY}\n'
    daemon = start_daemon(workdir, config=config, args=["--model-repository", str(repo)])
    path = str(daemon.socket_path)
    try:
        # served (a 24 MiB body of spaces is no JSON: 400) and refused at max_body_bytes (40 MiB: 413)
        sends = [(b"/v2/models/tiny_mlp/infer", 24, b"HTTP/1.1 400"), (b"/v2/repository/index", 40, b"HTTP/1.1 413")]
        for target, mib, status in sends:  # warm-up: the allocator's first large blocks
            assert _send_chunked(path, target, mib).startswith(status)
        before = daemon.rss_kib()
        for i in range(BODIES):
            target, mib, status = sends[i % 2]
            assert _send_chunked(path, target, mib).startswith(status)
        growth = daemon.rss_kib() - before
        print(f"RSS {before // 1024} MiB -> +{growth // 1024} MiB over {BODIES} chunked bodies of 24-40 MiB")
        assert growth < RSS_GROWTH_LIMIT_KIB, f"RSS grew by {growth // 1024} MiB over {BODIES} chunked bodies"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:  # and the daemon still serves
            sock.connect(path)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 200")
    finally:
        daemon.stop(10)
        shutil.rmtree(workdir, ignore_errors=True)
