"""EdgedClient against a real server (serving package + InferenceService on the sample models) on a real
Unix socket: every call, numpy in and out, typed errors with the daemon's message, keep-alive, timeouts."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import server_harness as harness

from edged.client import (
    AsyncEdgedClient,
    ClientError,
    ClientTimeout,
    EdgedClient,
    InvalidInputError,
    ModelNotFoundError,
    PayloadTooLargeError,
    ServerError,
)

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture
def client(server):  # type: ignore[no-untyped-def]
    with EdgedClient(server.socket_path, timeout_s=10) as c:
        yield c


def reference(x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(MODELS / "tiny_mlp" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def test_health_and_server_metadata(client: EdgedClient) -> None:
    assert client.live() is True
    assert client.ready() is True
    meta = client.server_metadata()
    assert meta["name"] == "edged"
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_config_and_readiness(client: EdgedClient) -> None:
    meta = client.model_metadata("tiny_mlp")
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert client.model_metadata("tiny_mlp", "1")["name"] == "tiny_mlp"
    assert client.model_config("tiny_mlp")["max_batch_size"] == 64
    assert client.model_ready("tiny_mlp") is True
    assert client.model_ready("tiny_mlp", "1") is True


@pytest.mark.parametrize("binary", [True, False])
def test_infer_returns_what_onnxruntime_computes(client: EdgedClient, binary: bool) -> None:
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    result = client.infer("tiny_mlp", {"input": x}, binary=binary, request_id="r-7")
    assert result.model_name == "tiny_mlp"
    assert result.model_version == "1"
    assert result.id == "r-7"
    out = result.as_numpy("output")
    assert out.dtype == np.float32 and out.shape == (3, 10)
    np.testing.assert_allclose(out, reference(x), rtol=1e-5, atol=1e-6)
    kind = "binary_data_size" if binary else "data"
    entry = result.doc["outputs"][0]
    assert kind in entry or kind in entry.get("parameters", {})


def test_infer_requested_output_and_version(client: EdgedClient) -> None:
    x = np.zeros((1, 64), np.float32)
    result = client.infer("tiny_mlp", {"input": x}, outputs=["output"], version="1")
    assert list(result.outputs) == ["output"]
    with pytest.raises(KeyError, match="output 'nope' is not in the response"):
        result.as_numpy("nope")


def test_unknown_model_is_model_not_found_with_the_servers_message(client: EdgedClient) -> None:
    with pytest.raises(ModelNotFoundError) as raised:
        client.model_metadata("no_such_model")
    assert raised.value.status == 404
    assert "no_such_model" in str(raised.value)
    with pytest.raises(ModelNotFoundError):
        client.infer("no_such_model", {"input": np.zeros((1, 64), np.float32)})
    assert client.model_ready("no_such_model") is False  # Triton's answer too: 400 with no body


def test_a_wrong_shape_is_invalid_input_naming_the_tensor(client: EdgedClient) -> None:
    with pytest.raises(InvalidInputError) as raised:
        client.infer("tiny_mlp", {"input": np.zeros((1, 63), np.float32)})
    assert raised.value.status == 400
    assert "'input'" in str(raised.value) and "63" in str(raised.value)
    assert isinstance(raised.value, ServerError) and isinstance(raised.value, ClientError)


def test_statistics_index_metrics_and_status(client: EdgedClient) -> None:
    client.infer("tiny_mlp", {"input": np.zeros((2, 64), np.float32)})
    stats = client.statistics("tiny_mlp")["model_stats"]
    assert stats[0]["name"] == "tiny_mlp" and stats[0]["inference_count"] >= 2
    assert {s["name"] for s in client.statistics()["model_stats"]} >= {"tiny_mlp", "digits_onnx"}
    index = client.repository_index()
    assert {(m["name"], m["state"]) for m in index} >= {("tiny_mlp", "READY"), ("digits_onnx", "READY")}
    assert 'nv_inference_request_success{model="tiny_mlp"' in client.metrics()
    status = client.status()
    assert status["live"] is True and status["ready"] is True


def test_one_connection_carries_many_requests(server, client: EdgedClient) -> None:  # type: ignore[no-untyped-def]
    for _ in range(20):
        client.live()
    assert client.status()["connections"] == 1


def test_a_keep_alive_connection_the_server_closed_is_replaced() -> None:
    quick = harness.ThreadedServer(models=("tiny_mlp",), idle_timeout_s=0.2).start()
    try:
        with EdgedClient(quick.socket_path, timeout_s=10) as client:
            assert client.live()
            time.sleep(0.6)  # the server's sweeper closes the idle connection
            x = np.ones((1, 64), np.float32)
            assert client.infer("tiny_mlp", {"input": x}).as_numpy("output").shape == (1, 10)
            time.sleep(0.6)
            assert client.ready() is True
    finally:
        quick.stop()


def test_no_answer_within_the_timeout_is_client_timeout(tmp_path: Path) -> None:
    path = str(tmp_path / "silent.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]))
    thread.start()
    with pytest.raises(ClientTimeout, match=r"liveness: no answer from .*silent\.sock within 0\.2 s"), \
            EdgedClient(path, timeout_s=0.2) as client:
        client.live()
    thread.join()
    for sock in (*accepted, listener):
        sock.close()
    os.unlink(path)


def test_a_request_the_server_refuses_mid_body_reports_its_answer() -> None:
    small = harness.ThreadedServer(models=("tiny_mlp",), max_body_bytes=64 * 1024).start()
    big = {"input": np.zeros((1024, 1024), np.float32)}  # 4 MiB: the server answers 413 and closes early
    try:
        with EdgedClient(small.socket_path) as client:
            with pytest.raises(PayloadTooLargeError) as raised:
                client.infer("tiny_mlp", big)
            assert raised.value.status == 413
            assert client.live()

        async def scenario() -> None:
            async with AsyncEdgedClient(small.socket_path) as aclient:
                with pytest.raises(PayloadTooLargeError):
                    await aclient.infer("tiny_mlp", big)
                assert await aclient.live()
        asyncio.run(scenario())
    finally:
        small.stop()


class ScriptedServer:
    """A minimal HTTP server on a real Unix socket that answers or hangs up per request, counting POSTs."""

    OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
    INFER = b'{"model_name":"m","outputs":[{"name":"y","datatype":"FP32","shape":[1,1],"data":[2.0]}]}'

    def __init__(self, path: str, script: list[str]) -> None:
        self.path = path
        self.script = script  # per request, in order: "answer", "answer-then-close" or "hang-up"
        self.posts = 0
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.script:
            conn, _ = self.listener.accept()
            with conn:
                while self.script and self._one(conn):
                    pass

    def _one(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += conn.recv(65536)
        if head.startswith(b"POST"):
            self.posts += 1
        action = self.script.pop(0)
        if action == "hang-up":
            return False
        payload = self.INFER if head.startswith(b"POST") else b"{}"
        conn.sendall(self.OK % (len(payload), payload))
        return action == "answer"

    def close(self) -> None:
        self.script.clear()
        self.listener.close()
        os.unlink(self.path)


def test_a_post_whose_connection_drops_after_sending_is_not_sent_again(tmp_path: Path) -> None:
    server = ScriptedServer(str(tmp_path / "drop.sock"), ["answer", "hang-up", "answer", "answer"])
    try:
        with EdgedClient(server.path, timeout_s=5) as client:
            assert client.live()  # opens the kept-alive connection the POST then reuses
            with pytest.raises(ClientError, match="not repeated, since it may have run"):
                client.infer("m", {"x": np.ones((1, 1), np.float32)})
            assert server.posts == 1  # the inference ran once; a resend would have run it twice
            assert client.live()  # the client recovers on a fresh connection
    finally:
        server.close()


def test_a_post_after_the_daemon_closed_the_idle_connection_goes_once_on_a_fresh_one(tmp_path: Path) -> None:
    server = ScriptedServer(str(tmp_path / "idle.sock"), ["answer-then-close", "answer"])
    try:
        with EdgedClient(server.path, timeout_s=5) as client:
            assert client.live()
            for _ in range(500):  # until the server thread has closed its end
                if not server.script[1:]:
                    break
                time.sleep(0.01)
            time.sleep(0.05)
            assert client.infer("m", {"x": np.ones((1, 1), np.float32)}).as_numpy("y").tolist() == [[2.0]]
            assert server.posts == 1
    finally:
        server.close()


def test_the_async_client_does_not_send_a_dropped_post_again(tmp_path: Path) -> None:
    server = ScriptedServer(str(tmp_path / "adrop.sock"), ["answer", "hang-up", "answer"])

    async def scenario() -> None:
        async with AsyncEdgedClient(server.path, timeout_s=5) as client:
            assert await client.live()
            with pytest.raises(ClientError, match="not repeated, since it may have run"):
                await client.infer("m", {"x": np.ones((1, 1), np.float32)})
            assert await client.live()
    try:
        asyncio.run(scenario())
        assert server.posts == 1
    finally:
        server.close()


def test_the_async_client_keeps_an_http_1_1_connection_for_the_next_request(tmp_path: Path) -> None:
    """llhttp forgets a message's keep-alive after it completes: the transport must read it in time."""
    server = ScriptedServer(str(tmp_path / "keep.sock"), ["answer", "answer"])

    async def scenario() -> int:
        async with AsyncEdgedClient(server.path, timeout_s=5) as client:
            assert await client.live()
            idle = len(client._transport._idle)
            assert await client.live()  # on the same connection: the scripted server serves one connection
            return idle
    try:
        assert asyncio.run(scenario()) == 1
    finally:
        server.close()
