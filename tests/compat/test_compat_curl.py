"""curl over the Unix socket: what an operator types on a device (health, metadata, a JSON inference)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


def curl(server, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(["curl", "-sS", "--unix-socket", server.socket_path, *args], check=False,
                          capture_output=True,
                          text=True, timeout=30)


def test_health_routes_answer_200(tcp_server) -> None:  # type: ignore[no-untyped-def]
    for route in ("/v2/health/live", "/v2/health/ready", "/v2/models/tiny_mlp/ready"):
        done = curl(tcp_server, "-o", "/dev/null", "-w", "%{http_code}", f"http://localhost{route}")
        assert done.stdout == "200", (route, done.stderr)


def test_metadata_is_json(tcp_server) -> None:  # type: ignore[no-untyped-def]
    assert json.loads(curl(tcp_server, "http://localhost/v2").stdout)["name"] == "edged"
    meta = json.loads(curl(tcp_server, "http://localhost/v2/models/tiny_mlp").stdout)
    assert meta["inputs"][0]["shape"] == [-1, 64]


def test_json_inference(tcp_server) -> None:  # type: ignore[no-untyped-def]
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.25] * 64}]}
    done = curl(tcp_server, "-H", "Content-Type: application/json", "-d", json.dumps(body),
                "http://localhost/v2/models/tiny_mlp/infer")
    doc = json.loads(done.stdout)
    assert doc["outputs"][0]["shape"] == [1, 10] and len(doc["outputs"][0]["data"]) == 10


def test_an_error_is_a_json_error_with_status(tcp_server) -> None:  # type: ignore[no-untyped-def]
    done = curl(tcp_server, "-w", "\n%{http_code}", "http://localhost/v2/models/nope")
    body, status = done.stdout.rsplit("\n", 1)
    assert status == "404" and "nope" in json.loads(body)["error"]
