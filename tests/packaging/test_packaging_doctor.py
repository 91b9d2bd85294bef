"""`edged doctor` on fixture trees (nv_tegra_release lines from docs/jetson.md §2, /proc/meminfo from
tests/fixtures/sysfs), a real Unix socket server and the real daemon.

The checks run in this process through the doctor's own parser and ``collect`` (a subprocess costs 1.5 s of
imports each time); the JSON and table front ends run as the real ``edged doctor`` command.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from socketserver import UnixStreamServer

import pytest
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon
from modelgen import add_custom_model

from edged.cli._doctor_checks import check_daemon_memory
from edged.cli.doctor import collect, exit_status
from edged.cli.main import build_parser
from edged.platform import parse_nv_tegra_release

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"

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


def doctor(*args: str, env: dict[str, str] | None = None, cli: bool = False) -> tuple[int, list[dict[str, str]]]:
    """Exit status and the checks as JSON objects; ``cli``: through the ``edged doctor --json`` command."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("EDGED_SOCKET", "RUNTIME_DIRECTORY")}
    full_env.update(env or {})
    if cli:
        result = subprocess.run([sys.executable, "-m", "edged.cli.main", "doctor", "--json", *args],
                                capture_output=True, text=True, env=full_env, timeout=120, check=False)
        assert result.stdout, result.stderr
        return result.returncode, json.loads(result.stdout)
    parsed = build_parser(only="doctor").parse_args(["doctor", *args])
    results = collect(parsed, full_env)
    return exit_status(results, parsed.strict), [dataclasses.asdict(c) for c in results]


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
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
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
    code, checks = doctor("--root", str(tmp_path), "--socket", str(ready_socket), cli=True)
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


def test_grpc_listeners_are_probed_with_the_http2_preface_and_fail_with_the_fix_when_gone(tmp_path: Path) -> None:
    with socket.socket() as probe:  # the config must name the port doctor probes: one free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    grpc_socket = tmp_path / "grpc.sock"
    config = tmp_path / "edged.toml"
    config.write_text(config_with_fakes(f'[server]\ngrpc_port = {port}\ngrpc_socket = "{grpc_socket}"\n'
                                        'socket_mode = "0660"\n'))
    daemon = start_daemon(tmp_path / "d", config=config.read_text())
    try:
        _, checks = doctor("--root", str(tmp_path), "--socket", str(daemon.socket_path), "--config", str(config))
    finally:
        daemon.stop()
    grpc = [c for c in checks if c["name"].startswith("gRPC")]
    assert [c["name"] for c in grpc] == ["gRPC socket", "gRPC daemon", "gRPC daemon"], grpc
    assert grpc[0]["status"] == "ok" and "mode 0660" in grpc[0]["detail"]
    assert grpc[1]["status"] == grpc[2]["status"] == "ok", grpc
    assert f"unix:{grpc_socket}" in grpc[1]["detail"] and f"127.0.0.1:{port}" in grpc[2]["detail"]
    # the daemon is gone: its gRPC socket with it, and nothing answers on the port
    _, checks = doctor("--root", str(tmp_path), "--socket", str(tmp_path / "none.sock"), "--config", str(config))
    grpc = [c for c in checks if c["name"].startswith("gRPC")]
    assert [(c["name"], c["status"]) for c in grpc] == [("gRPC socket", "fail"), ("gRPC daemon", "fail")], grpc
    assert all(c["fix"] for c in grpc)


def test_a_grpc_address_answered_by_something_else_fails_and_grpc_off_is_info(tmp_path: Path,
                                                                              ready_socket: Path) -> None:
    config = tmp_path / "edged.toml"
    config.write_text(f'[server]\ngrpc_socket = "{ready_socket}"\n')  # an HTTP/1.1 server, not HTTP/2
    _, checks = doctor("--root", str(tmp_path), "--socket", str(ready_socket), "--config", str(config))
    answer = [c for c in checks if c["name"] == "gRPC daemon"]
    assert len(answer) == 1 and answer[0]["status"] == "fail", answer
    assert "not as an HTTP/2 server" in answer[0]["detail"] and answer[0]["fix"]
    _, checks = doctor("--root", str(tmp_path), "--socket", str(ready_socket))
    assert by_name(checks)["gRPC"]["status"] == "info"


def test_table_output_shows_status_words_and_fixes(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "edged.cli.main", "doctor", "--root", str(tmp_path),
                             "--socket", str(tmp_path / "none.sock")], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 1
    assert "FAIL  socket" in result.stdout
    assert "fix: start the daemon" in result.stdout


# --- the memory picture -----------------------------------------------------------------------------------

PSI = "some avg10={some:.2f} avg60=0.80 avg300=0.31 total=4021337\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def orin_tree(root: Path, some_avg10: float | None = 1.25, mem_available_kb: int | None = None) -> Path:
    """The Orin Nano 8GB fixture's /proc/meminfo (with NvMap lines), optionally PSI and another MemAvailable."""
    jetson_tree(root, JP62_ORIN, "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super")
    shutil.copy(FIXTURES / "orin_nano_jp6/proc/meminfo", root / "proc/meminfo")
    if mem_available_kb is not None:
        meminfo = root / "proc/meminfo"
        lines = [f"MemAvailable:    {mem_available_kb} kB" if line.startswith("MemAvailable:") else line
                 for line in meminfo.read_text().splitlines()]
        meminfo.write_text("\n".join(lines) + "\n")
    if some_avg10 is not None:
        (root / "proc/pressure").mkdir()
        (root / "proc/pressure/memory").write_text(PSI.format(some=some_avg10))
    return root


def config_file(tmp_path: Path, memory: str) -> str:
    path = tmp_path / "edged.toml"
    path.write_text(f"[memory]\n{memory}")
    return str(path)


def test_jetson_memory_shows_total_available_nvmap_psi_and_the_budget_in_bytes(tmp_path: Path) -> None:
    root = orin_tree(tmp_path / "root")
    config = config_file(tmp_path, 'budget_percent = 50\npolicy = "evict_lru"\n')
    _, checks = doctor("--root", str(root), "--config", config, "--socket", str(tmp_path / "none.sock"))
    found = by_name(checks)
    # MemTotal 7802376 kB, MemAvailable 5147644 kB, NvMapMemUsed 512460 kB in the fixture
    assert found["memory"] == {"name": "memory", "status": "ok", "fix": None,
                               "detail": "MemTotal 7,620 MiB, MemAvailable 5,027 MiB (66%), NvMapMemUsed 500 MiB "
                                         "(GPU buffers, in the same DRAM)"}
    assert found["memory PSI"]["status"] == "ok"
    assert found["memory PSI"]["detail"].startswith("some avg10 1.25%")
    budget = found["memory budget"]
    assert budget["status"] == "ok"
    assert budget["detail"].startswith(f"{7802376 * 1024 // 2 / 2**20:,.0f} MiB (budget_percent = 50 of MemTotal)")
    assert "evict_lru" in budget["detail"]


def test_low_mem_available_and_memory_stalls_warn_with_their_fixes(tmp_path: Path) -> None:
    root = orin_tree(tmp_path / "root", some_avg10=55.0, mem_available_kb=200 * 1024)
    config = config_file(tmp_path, "pressure_min_available_mb = 256\npressure_some_avg10_max = 40\n")
    args = ("--root", str(root), "--config", config, "--socket", str(tmp_path / "none.sock"))
    _, checks = doctor(*args)
    memory, psi = by_name(checks)["memory"], by_name(checks)["memory PSI"]
    assert memory["status"] == "warn"
    assert "MemAvailable 200 MiB" in memory["detail"] and "256 MiB" in memory["detail"]
    assert memory["fix"].startswith("MemAvailable below the pressure threshold: unload models")
    assert "budget_mb" in memory["fix"]
    assert psi["status"] == "warn"
    assert "55.00%" in psi["detail"] and "40%" in psi["detail"]
    assert psi["fix"]


def test_missing_meminfo_and_psi_are_information_not_problems(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "nano_jp4/proc", root / "proc")  # JetPack 4's fixture has no MemAvailable
    _, checks = doctor("--root", str(root), "--socket", str(tmp_path / "none.sock"))
    found = by_name(checks)
    assert found["memory"]["status"] == "info"
    assert "no MemTotal/MemAvailable" in found["memory"]["detail"]
    assert found["memory PSI"]["status"] == "info"
    assert "CONFIG_PSI" in found["memory PSI"]["detail"]
    assert found["memory budget"]["status"] == "info"
    assert "budget_percent" in found["memory budget"]["fix"]


def test_a_budget_beyond_mem_total_warns(tmp_path: Path) -> None:
    root = orin_tree(tmp_path / "root")
    _, checks = doctor("--root", str(root), "--config", config_file(tmp_path, "budget_mb = 16384\n"),
                       "--socket", str(tmp_path / "none.sock"))
    budget = by_name(checks)["memory budget"]
    assert budget["status"] == "warn"
    assert "16,384 MiB (budget_mb = 16384)" in budget["detail"]
    assert "below 7619" in budget["fix"]


def test_configured_allocator_library_present_or_missing_with_the_package_to_install(tmp_path: Path) -> None:
    library = tmp_path / "libjemalloc.so.2"
    library.write_bytes(b"\x7fELF")
    present = config_file(tmp_path, f'allocator = "jemalloc"\nallocator_library = "{library}"\n')
    _, checks = doctor("--root", str(tmp_path), "--config", present, "--socket", str(tmp_path / "none.sock"))
    allocator = by_name(checks)["allocator"]
    assert allocator["status"] == "ok"
    assert f"configured: jemalloc, {library} exists" in allocator["detail"]
    assert "in this process: system" in allocator["detail"]  # the doctor itself runs on glibc
    library.unlink()
    _, checks = doctor("--root", str(tmp_path), "--config", present, "--socket", str(tmp_path / "none.sock"))
    allocator = by_name(checks)["allocator"]
    assert allocator["status"] == "warn"
    assert f"allocator_library = '{library}' does not exist" in allocator["detail"]
    assert allocator["fix"].startswith("sudo apt install libjemalloc2")


@pytest.fixture
def daemon_workdir(tmp_path: Path) -> Iterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        daemon.stop()


def test_running_daemon_reports_its_budget_use_and_charges(tmp_path: Path,
                                                            daemon_workdir: list[DaemonProcess]) -> None:
    repo = tmp_path / "models"
    add_custom_model(repo, "doubling", "doubling")
    config = config_with_fakes(f'repository = "{repo}"\n\n[memory]\nbudget_mb = 64\n')
    daemon = start_daemon(tmp_path / "d", config=config)
    daemon_workdir.append(daemon)
    code, checks = doctor("--root", str(tmp_path), "--socket", str(daemon.socket_path),
                          "--config", str(tmp_path / "d/edged.toml"))
    row = by_name(checks)["memory (daemon)"]
    assert row["status"] == "ok", row
    assert " of 64 MiB (" in row["detail"]
    assert "charges: doubling/1 " in row["detail"]
    assert "policy refuse" in row["detail"] and "under pressure: no" in row["detail"]
    assert code == 0


def test_daemon_under_memory_pressure_warns_with_its_reason(tmp_path: Path,
                                                            daemon_workdir: list[DaemonProcess]) -> None:
    # The daemon judges the real /proc: a threshold no machine reaches puts it under pressure.
    config = config_with_fakes(f'repository = "{tmp_path / "empty"}"\n\n[memory]\n'
                               "pressure_min_available_mb = 100000000\n")
    (tmp_path / "empty").mkdir()
    daemon = start_daemon(tmp_path / "d", config=config)
    daemon_workdir.append(daemon)
    _, checks = doctor("--root", str(tmp_path), "--socket", str(daemon.socket_path), "--strict")
    row = by_name(checks)["memory (daemon)"]
    assert row["status"] == "warn", row
    assert "under memory pressure (MemAvailable" in row["detail"]
    assert "charges: none" in row["detail"]
    assert row["fix"].startswith("unload models")


# The memory block as the daemon's /v2/edged/status gives it (EdgedApp.status).
STATUS_MEMORY = {"budget_bytes": 512 * 2**20, "used_bytes": 480 * 2**20,
                 "charges": {"resnet/1": 300 * 2**20, "yolo/2": 180 * 2**20}, "policy": "refuse",
                 "under_pressure": False, "pressure_reason": "ok", "mem_available_bytes": 2**31,
                 "last_release": None, "allocator": "system", "allocator_library": "/lib/libc.so.6",
                 "allocator_settings": {}}


def test_nearly_full_budget_and_an_allocator_that_did_not_take_are_warnings() -> None:
    check = check_daemon_memory(STATUS_MEMORY, "jemalloc")
    assert check.status == "warn"
    assert "used 480 MiB of 512 MiB (94%)" in check.detail
    assert "charges: resnet/1 300 MiB, yolo/2 180 MiB" in check.detail
    assert "the budget is 94% used" in check.detail
    assert "runs on system although [memory] allocator = jemalloc" in check.detail
    assert check.fix is not None and "raise [memory] budget_mb" in check.fix and "allocator row" in check.fix
    assert check_daemon_memory({**STATUS_MEMORY, "used_bytes": 100 * 2**20}, "system").status == "ok"
