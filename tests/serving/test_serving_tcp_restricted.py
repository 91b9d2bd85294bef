"""Loopback TCP carries no credentials: Triton's restricted API categories, with tritonclient.http as the
caller, and the ``[server.tcp_restricted]`` table as read from TOML."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton_http
from conftest import RunningServer, make_server
from tritonclient.utils import InferenceServerException

from edged.config import ModelsConfig, ServerConfig, parse_config
from edged.engine import InferenceService
from edged.errors import ConfigError
from edged.serving import HttpServer

KEY = {"edged-key": "s3cret-value"}
EXPLICIT = ModelsConfig(control_mode="explicit", startup_models=("*",))


def _client(running: RunningServer) -> triton_http.InferenceServerClient:
    return triton_http.InferenceServerClient(f"127.0.0.1:{running.tcp_port}")


def _infer(triton: triton_http.InferenceServerClient, headers: dict[str, str] | None = None) -> None:
    tensor = triton_http.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
    triton.infer("tiny_mlp", [tensor], headers=headers)


@pytest.fixture
def default_server(tmp_path: Path) -> Iterator[RunningServer]:
    running = make_server(tmp_path, models=EXPLICIT)
    yield running
    running.stop()


@pytest.fixture
def keyed_server(tmp_path: Path) -> Iterator[RunningServer]:
    running = make_server(tmp_path, models=EXPLICIT, tcp_restricted={"model-repository": "edged-key=s3cret-value",
                                                                     "inference": "edged-key=s3cret-value"})
    yield running
    running.stop()


def test_by_default_tcp_clients_may_not_load_or_unload_but_read_the_index_and_infer(
        default_server: RunningServer) -> None:
    triton = _client(default_server)
    try:
        for call in (lambda: triton.load_model("tiny_mlp"), lambda: triton.unload_model("tiny_mlp")):
            with pytest.raises(InferenceServerException, match=r"set server\.tcp_restricted\.model-repository") as e:
                call()
            assert "403" in str(e.value.status())
        assert {m["name"] for m in triton.get_model_repository_index()} >= {"tiny_mlp", "tiny_strict"}
        _infer(triton)
        assert triton.is_server_ready() and triton.is_model_ready("tiny_mlp")  # the unload was refused
    finally:
        triton.close()
    assert default_server.request("POST", "/v2/repository/models/tiny_mlp/load")[0] == 200  # socket: root


def test_a_configured_key_admits_tcp_requests_that_carry_it_and_only_those(keyed_server: RunningServer) -> None:
    triton = _client(keyed_server)
    try:
        for headers in (None, {"edged-key": "wrong"}, {"other-header": "s3cret-value"}):
            with pytest.raises(InferenceServerException, match="requires the header 'edged-key'") as e:
                triton.unload_model("tiny_strict", headers=headers)
            assert "s3cret" not in str(e.value)
            with pytest.raises(InferenceServerException, match="inference API over loopback TCP requires"):
                _infer(triton, headers)
        with pytest.raises(InferenceServerException, match="requires the header"):
            triton.get_model_repository_index()  # a configured category is restricted whole, as in Triton
        triton.unload_model("tiny_strict", headers=KEY)
        assert not triton.is_model_ready("tiny_strict")  # health stays open
        triton.load_model("tiny_strict", headers=KEY)
        assert triton.is_model_ready("tiny_strict")
        _infer(triton, KEY)
    finally:
        triton.close()
    # the table is for TCP only: on the Unix socket peer credentials decide, and root needs no header
    assert keyed_server.request("POST", "/v2/repository/models/tiny_strict/unload")[0] == 200


def _toml(table: str) -> str:
    return f"[server.tcp_restricted]\n{table}\n"


def test_the_table_accepts_triton_categories_with_header_and_value() -> None:
    config = parse_config(_toml('model-repository = "edged-key=SECRET"\nstatistics = "X-Token=abc"'))
    assert config.server.tcp_restricted == {"model-repository": "edged-key=SECRET", "statistics": "X-Token=abc"}


@pytest.mark.parametrize(("table", "message"), [
    ('model-repo = "edged-key=SECRET"', "unknown key server.tcp_restricted.model-repo: expected one of Triton"),
    ('trace = "edged-key=SECRET"', "tcp_restricted.trace: edged serves no trace routes"),
    ('inference = "edged-key SECRET"', 'tcp_restricted.inference: expected "HEADER=VALUE"'),
    ('inference = "edged-key="', 'tcp_restricted.inference: expected "HEADER=VALUE"'),
    ('inference = "bad header=SECRET"', 'tcp_restricted.inference: expected "HEADER=VALUE"'),
    ('inference = "Content-Length=SECRET"', "header 'Content-Length' is one edged or HTTP itself interprets"),
])
def test_bad_entries_are_config_errors_naming_the_key_without_the_secret(table: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(_toml(table))
    assert message in str(e.value)
    assert "SECRET" not in str(e.value)


def test_a_table_without_a_tcp_listener_is_refused_at_start(tmp_path: Path) -> None:
    service = InferenceService(tmp_path, ModelsConfig())
    server = HttpServer(service, ServerConfig(tcp_restricted={"model-repository": "edged-key=s3cret-value"}))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "edged.sock"))
    try:
        with pytest.raises(ConfigError, match=r"server\.tcp_restricted is set but edged has no TCP listener"):
            asyncio.run(server.start([sock]))
    finally:
        sock.close()
