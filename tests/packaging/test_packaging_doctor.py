"""`edged doctor` on fixture trees (nv_tegra_release lines from JETSON.md §2) and a real Unix socket server."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from socketserver import UnixStreamServer

import pytest

from edged.cli._doctor_platform import parse_nv_tegra_release

JP62_ORIN = ("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
             "DATE: Wed Jan  8 01:49:37 UTC 2025\n")
JP514_XAVIER = ("# R35 (release), REVISION: 6.0, GCID: 36191598, BOARD: t186ref, EABI: aarch64, "
                "DATE: Mon May  6 17:32:05 UTC 2024\n")
R39_ORIN = ("# R39 (release), REVISION: 2.1, GCID: 41000000, BOARD: generic, EABI: aarch64, DATE: x\n"
            "# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n")


def jetson_tree(root: Path, release: str, model: str) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc/nv_tegra_release").write_text(release)
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/model").write_bytes(model.encode() + b"\0")
    return root


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[dict[str, str]]]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("EDGED_SOCKET", "RUNTIME_DIRECTORY")}
    full_env.update(env or {})
    result = subprocess.run([sys.executable, "-m", "edged.cli.main", "doctor", "--json", *args],
                            capture_output=True, text=True, env=full_env, timeout=120, check=False)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def by_name(checks: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in checks}


class _Ready(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/v2/health/ready" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _UnixHTTPServer(UnixStreamServer, HTTPServer):
    def server_bind(self) -> None:
        UnixStreamServer.server_bind(self)
        self.server_name, self.server_port = "localhost", 0

    def get_request(self) -> tuple[socket.socket, tuple[str, int]]:
        request, _ = super().get_request()
        return request, ("local", 0)


def serve(path: Path, status: int) -> Iterator[Path]:
    handler = type("Handler", (_Ready,), {"status": status})
    old = os.umask(0o117)  # 0660, as the daemon creates it
    try:
        server = _UnixHTTPServer(str(path), handler)
    finally:
        os.umask(old)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()


@pytest.fixture
def ready_socket(tmp_path: Path) -> Iterator[Path]:
    yield from serve(tmp_path / "edged.sock", 200)


@pytest.fixture
def loading_socket(tmp_path: Path) -> Iterator[Path]:
    yield from serve(tmp_path / "edged.sock", 503)


@pytest.mark.parametrize(("text", "version", "jetpack", "board"), [
    (JP62_ORIN, "36.4.3", "6.2", "generic"),
    (JP514_XAVIER, "35.6.0", "5.1.4", "t186ref"),
    (R39_ORIN, "39.2.1", "7.2", "generic"),
    ("# R32 (release), REVISION: 7.4, GCID: 1, BOARD: t210ref, EABI: aarch64, DATE: x\n", "32.7.4", "4.6.4",
     "t210ref"),
])
def test_nv_tegra_release_gives_l4t_and_a_jetpack_label(text: str, version: str, jetpack: str,
                                                         board: str) -> None:
    release = parse_nv_tegra_release(text)
    assert release is not None
    assert (release.version, release.jetpack, release.board) == (version, jetpack, board)


def test_unknown_text_is_not_a_release() -> None:
    assert parse_nv_tegra_release("Ubuntu 22.04\n") is None
    assert parse_nv_tegra_release("") is None


def test_jetson_tree_reports_module_and_release_and_missing_tensorrt_with_its_fix(
        tmp_path: Path, ready_socket: Path) -> None:
    root = jetson_tree(tmp_path / "root", JP62_ORIN, "NVIDIA Jetson AGX Orin Developer Kit")
    code, checks = doctor("--root", str(root), "--socket", str(ready_socket))
    found = by_name(checks)
    assert found["module"]["detail"] == "NVIDIA Jetson AGX Orin Developer Kit"
    assert found["L4T / JetPack"] == {"name": "L4T / JetPack", "status": "ok",
                                      "detail": "L4T 36.4.3 (JetPack 6.2)", "fix": None}
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here; the fixture tree tests its absence")
    assert found["TensorRT"]["status"] == "fail"
    assert "python3-libnvinfer" in found["TensorRT"]["fix"]
    assert code == 1


def test_plain_machine_with_a_ready_daemon_is_healthy(tmp_path: Path, ready_socket: Path) -> None:
    code, checks = doctor("--root", str(tmp_path), "--socket", str(ready_socket))
    found = by_name(checks)
    assert found["L4T / JetPack"]["status"] == "info"
    assert found["socket"]["status"] == "ok", found["socket"]
    assert found["daemon"]["status"] == "ok", found["daemon"]
    assert [c for c in checks if c["status"] == "fail"] == []
    assert code == 0


def test_daemon_not_ready_is_a_warning_and_strict_makes_it_fail(tmp_path: Path, loading_socket: Path) -> None:
    code, checks = doctor("--root", str(tmp_path), "--socket", str(loading_socket))
    assert by_name(checks)["daemon"]["status"] == "warn"
    assert "503" in by_name(checks)["daemon"]["detail"]
    assert code == 0
    strict_code, _ = doctor("--root", str(tmp_path), "--socket", str(loading_socket), "--strict")
    assert strict_code == 1


def test_stale_socket_file_fails_with_the_fix(tmp_path: Path) -> None:
    stale = tmp_path / "edged.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(stale))
    listener.close()  # the file stays, nobody listens: a daemon that crashed
    os.chmod(stale, 0o660)
    code, checks = doctor("--root", str(tmp_path), "--socket", str(stale))
    daemon = by_name(checks)["daemon"]
    assert daemon["status"] == "fail"
    assert "systemctl start edged" in daemon["fix"]
    assert code == 1


def test_world_writable_socket_is_flagged(tmp_path: Path, ready_socket: Path) -> None:
    os.chmod(ready_socket, 0o666)
    _, checks = doctor("--root", str(tmp_path), "--socket", str(ready_socket))
    assert by_name(checks)["socket"]["status"] == "warn"
    assert "0660" in by_name(checks)["socket"]["fix"]


def test_socket_is_found_through_edged_socket_then_xdg_runtime_dir(tmp_path: Path, ready_socket: Path) -> None:
    _, checks = doctor("--root", str(tmp_path), env={"EDGED_SOCKET": str(ready_socket)})
    assert str(ready_socket) in by_name(checks)["daemon"]["detail"]
    xdg = tmp_path / "xdg"
    (xdg / "edged").mkdir(parents=True)
    os.link(ready_socket, xdg / "edged" / "edged.sock")
    _, checks = doctor("--root", str(tmp_path), env={"XDG_RUNTIME_DIR": str(xdg)})
    assert by_name(checks)["daemon"]["status"] == "ok"
    assert str(xdg / "edged" / "edged.sock") in by_name(checks)["daemon"]["detail"]


def test_missing_socket_names_every_place_tried(tmp_path: Path) -> None:
    code, checks = doctor("--root", str(tmp_path), env={"XDG_RUNTIME_DIR": str(tmp_path / "nothing")})
    assert by_name(checks)["socket"]["status"] == "fail"
    assert str(tmp_path / "nothing" / "edged" / "edged.sock") in by_name(checks)["socket"]["detail"]
    assert "daemon" not in by_name(checks)
    assert code == 1


def test_broker_reachability_is_a_real_tcp_connect(tmp_path: Path, ready_socket: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = tmp_path / "edged.toml"
    config.write_text(f'[mqtt]\nbroker = "mqtt://127.0.0.1:{port}"\n')
    _, checks = doctor("--root", str(tmp_path), "--socket", str(ready_socket), "--config", str(config))
    assert by_name(checks)["MQTT broker"]["status"] == "ok"
    listener.close()  # now nothing listens on that port
    code, checks = doctor("--root", str(tmp_path), "--socket", str(ready_socket), "--config", str(config))
    broker = by_name(checks)["MQTT broker"]
    assert broker["status"] == "fail"
    assert f"127.0.0.1:{port}" in broker["detail"]
    assert broker["fix"]
    assert code == 1


def test_table_output_shows_status_words_and_fixes(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "edged.cli.main", "doctor", "--root", str(tmp_path),
                             "--socket", str(tmp_path / "none.sock")], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 1
    assert "FAIL  socket" in result.stdout
    assert "fix: start the daemon" in result.stdout
