"""``[server] openai_api_key`` / ``openai_api_key_file``: with a key, the /v1 routes over loopback TCP answer
401 in OpenAI's error shape unless the request carries ``Authorization: Bearer <key>``; the Unix socket and the
KServe routes are unchanged; a key that would guard nothing, or cannot be read, is refused at start."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import server_harness as harness

from edged.config import ServerConfig, parse_config
from edged.engine import InferenceService
from edged.errors import ConfigError
from edged.serving import HttpServer

openai = pytest.importorskip("openai")

KEY = "edged-test-key-0123456789abcdef"
ASK = [{"role": "user", "content": "Open the gate"}]


@pytest.fixture(scope="module", params=["key", "file"])
def keyed_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[harness.ThreadedServer]:
    pytest.importorskip("onnxruntime_genai")
    if request.param == "key":
        options = {"openai_api_key": KEY}
    else:
        path = tmp_path_factory.mktemp("key") / "openai.key"
        path.write_text(KEY + "\n")
        path.chmod(0o600)
        options = {"openai_api_key_file": str(path)}
    server = harness.ThreadedServer(models=("tiny_llama",), tcp=True, server_options=options).start()
    yield server
    server.stop()


def tcp_client(server: harness.ThreadedServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=key, max_retries=0)


def test_the_right_key_is_served_over_tcp(keyed_server: harness.ThreadedServer) -> None:
    client = tcp_client(keyed_server, KEY)
    assert [m.id for m in client.models.list()] == ["tiny_llama"]
    reply = client.chat.completions.create(model="tiny_llama", messages=ASK, max_tokens=2, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(model="tiny_llama", messages=ASK, max_tokens=2, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("key", ["wrong-key-0123456789abcdef", KEY[:-1], KEY + "x", KEY.upper()])
def test_a_wrong_key_gets_openais_401(keyed_server: harness.ThreadedServer, key: str) -> None:
    with pytest.raises(openai.AuthenticationError) as raised:
        tcp_client(keyed_server, key).chat.completions.create(model="tiny_llama", messages=ASK, max_tokens=2)
    assert raised.value.status_code == 401
    assert raised.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    assert raised.value.body["type"] == "invalid_request_error"  # type: ignore[index]


@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("header", [None, "Basic " + KEY, "Bearer", "Bearer  " + KEY, KEY])
def test_every_v1_route_wants_the_bearer_key(keyed_server: harness.ThreadedServer, path: str,
                                             header: str | None) -> None:
    headers = {} if header is None else {"authorization": header}
    with httpx.Client(base_url=f"http://127.0.0.1:{keyed_server.port}") as http:
        if path == "/v1/models":
            response = http.get(path, headers=headers)
        else:
            response = http.post(path, headers=headers, json={"model": "tiny_llama", "messages": ASK,
                                                              "prompt": "x", "max_tokens": 1})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "Authorization: Bearer" in error["message"]
    assert KEY not in response.text


def head_answer(port: int, head: bytes) -> bytes:
    """What the server answers a request head sent alone (its body never follows), up to its close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(head)
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("target", [b"/v1/chat/completions", b"/%761/completions", b"/v1/models?x=1",
                                    b"http://127.0.0.1/v1/chat/completions"])
def test_a_request_without_the_key_is_refused_from_its_head(keyed_server: harness.ThreadedServer,
                                                            target: bytes) -> None:
    # A 50 MB body announced with Expect: 100-continue: the 401 comes before a byte of it is sent, with no
    # "100 Continue" inviting it, and the connection closes (the body is never read).
    answer = head_answer(keyed_server.port, b"POST " + target + b" HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 50000000\r\nExpect: 100-continue\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401 Unauthorized\r\n"), answer[:200]
    assert b"www-authenticate: Bearer" in head and b"connection: close" in head
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_api_key" and "Authorization: Bearer" in error["message"]


def test_a_request_with_the_key_still_gets_100_continue(keyed_server: harness.ThreadedServer) -> None:
    with socket.create_connection(("127.0.0.1", keyed_server.port), timeout=10) as raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                    b"Expect: 100-continue\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n")
        assert raw.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        raw.sendall(b"{}")
        assert raw.recv(65536).startswith(b"HTTP/1.1 400 ")  # the body was read: no prompt


def test_the_scheme_is_case_insensitive(keyed_server: harness.ThreadedServer) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{keyed_server.port}") as http:
        assert http.get("/v1/models", headers={"authorization": "bearer " + KEY}).status_code == 200


def test_the_unix_socket_and_kserve_routes_need_no_key(keyed_server: harness.ThreadedServer) -> None:
    transport = httpx.HTTPTransport(uds=keyed_server.socket_path)
    uds = openai.OpenAI(base_url="http://localhost/v1", api_key="anything", max_retries=0,
                        http_client=httpx.Client(transport=transport))
    assert [m.id for m in uds.models.list()] == ["tiny_llama"]
    with httpx.Client(base_url=f"http://127.0.0.1:{keyed_server.port}") as http:
        assert http.get("/v2/health/ready").status_code == 200


def test_without_a_key_tcp_stays_open() -> None:
    pytest.importorskip("onnxruntime_genai")
    server = harness.ThreadedServer(models=("tiny_llama",), tcp=True).start()
    try:
        assert [m.id for m in tcp_client(server, "anything").models.list()] == ["tiny_llama"]
    finally:
        server.stop()


@pytest.mark.parametrize(("toml", "words"), [
    (f'[server]\nopenai_api_key = "{KEY}"\nopenai_api_key_file = "/etc/edged/key"\n', "not both"),
    ('[server]\nopenai_api_key = "short"\n', "at least 16 characters"),
    (f'[server]\nopenai_api_key = " {KEY}"\n', "surrounding spaces"),
])
def test_bad_key_settings_are_refused_without_quoting_the_key(toml: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as raised:
        parse_config(toml)
    assert KEY not in str(raised.value) and "'short'" not in str(raised.value)


def test_an_unreadable_or_empty_key_file_is_refused_when_the_server_is_built(tmp_path: Path) -> None:
    service = InferenceService(harness.make_repository(str(tmp_path), ()), parse_config("").models)
    with pytest.raises(ConfigError, match="cannot read"):
        HttpServer(service, ServerConfig(openai_api_key_file=str(tmp_path / "missing")))
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        HttpServer(service, ServerConfig(openai_api_key_file=str(empty)))
    latin1 = tmp_path / "latin1.key"
    latin1.write_bytes("sécret-key-0123456789\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 1\)") as refused:
        HttpServer(service, ServerConfig(openai_api_key_file=str(latin1)))
    assert refused.value.__cause__ is None and refused.value.__context__ is None  # the key's bytes go nowhere


def test_a_key_without_a_tcp_listener_is_refused(tmp_path: Path) -> None:
    service = InferenceService(harness.make_repository(str(tmp_path), ()), parse_config("").models)
    socket_path = harness.short_tempdir("edged-key-") + "/edged.sock"
    config = ServerConfig(socket=socket_path, openai_api_key=KEY)
    listener = harness.unix_listener(config, Path(socket_path))
    server = HttpServer(service, config)
    try:
        with pytest.raises(ConfigError, match="no TCP listener"):
            asyncio.run(server.start([listener.socket]))
    finally:
        listener.socket.close()
        os.unlink(socket_path)
