"""System shared memory (Triton's extension) against a real server: Triton's own client and shared-memory
utilities over loopback TCP, Triton's JSON and status codes, and hostile or buggy clients (bounds, truncated and
unlinked objects, another user's object, key tricks, too many regions)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import RunningServer, make_server
from modelgen import add_tiny_delay_model

from edged.config import ModelsConfig

shm = pytest.importorskip("tritonclient.utils.shared_memory")
httpclient = pytest.importorskip("tritonclient.http")

KEY = "edged-key=shm-secret"  # over TCP, shared memory needs this header ([server.tcp_restricted])
HEADERS = {"edged-key": "shm-secret"}
FRAME = 64 * 4  # tiny_mlp's input: FP32 [1, 64]
RESULT = 10 * 4  # its output: FP32 [1, 10]


@pytest.fixture(scope="module")
def served() -> Iterator[RunningServer]:
    # Outside pytest's 0700 temporary root, so that a client running as another user can reach the socket.
    home = Path(tempfile.mkdtemp(prefix="edged-shm-"))
    home.chmod(0o755)
    running = make_server(home, socket_mode="0666", shm_max_regions=4, tcp_restricted={"shared-memory": KEY},
                          models=ModelsConfig(control_mode="explicit", startup_models=("tiny_mlp",)))
    yield running
    running.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def regions(served: RunningServer) -> Iterator[list[object]]:
    """Handles created by a test; destroyed (and unregistered server-side) afterwards."""
    handles: list[object] = []
    yield handles
    served.request("POST", "/v2/systemsharedmemory/unregister")
    for handle in handles:
        with contextlib.suppress(shm.SharedMemoryException, OSError):  # a test may have unlinked it already
            shm.destroy_shared_memory_region(handle)


def _key(name: str) -> str:
    return f"/edged_test_{os.getpid()}_{name}"


def _register(served: RunningServer, name: str, key: str, byte_size: int, offset: int = 0) -> tuple[int, bytes]:
    status, _, body = served.request("POST", f"/v2/systemsharedmemory/region/{name}/register",
                                     json.dumps({"key": key, "offset": offset, "byte_size": byte_size}).encode())
    return status, body


def _infer_body(region_in: str, region_out: str, in_size: int = FRAME, out_size: int = RESULT,
                in_offset: int = 0) -> bytes:
    return json.dumps({
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "parameters": {
            "shared_memory_region": region_in, "shared_memory_byte_size": in_size,
            "shared_memory_offset": in_offset}}],
        "outputs": [{"name": "output", "parameters": {
            "shared_memory_region": region_out, "shared_memory_byte_size": out_size}}],
    }).encode()


def test_tritonclient_shared_memory_round_trip_matches_a_plain_inference(served: RunningServer,
                                                                         regions: list[object]) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.tcp_port}")
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    plain_input = httpclient.InferInput("input", [1, 64], "FP32")
    plain_input.set_data_from_numpy(x)
    expected = client.infer("tiny_mlp", [plain_input]).as_numpy("output")

    in_handle = shm.create_shared_memory_region("in0", _key("in0"), FRAME)
    out_handle = shm.create_shared_memory_region("out0", _key("out0"), RESULT)
    regions += [in_handle, out_handle]
    shm.set_shared_memory_region(in_handle, [x])
    with pytest.raises(httpclient.InferenceServerException, match=r"tcp_restricted\.shared-memory"):
        client.register_system_shared_memory("in0", _key("in0"), FRAME)  # no header: refused over TCP
    client.register_system_shared_memory("in0", _key("in0"), FRAME, headers=HEADERS)
    client.register_system_shared_memory("out0", _key("out0"), RESULT, headers=HEADERS)
    status = client.get_system_shared_memory_status(headers=HEADERS)
    assert sorted(r["name"] for r in status) == ["in0", "out0"]

    shm_input = httpclient.InferInput("input", [1, 64], "FP32")
    shm_input.set_shared_memory("in0", FRAME)
    shm_output = httpclient.InferRequestedOutput("output", binary_data=True)
    shm_output.set_shared_memory("out0", RESULT)
    # an infer request is admitted as inference: naming a region over TCP needs the shared-memory key as well,
    # and a refused one neither reads the input region nor writes the output region
    shm.set_shared_memory_region(out_handle, [np.full((1, 10), 7.0, np.float32)])
    with pytest.raises(httpclient.InferenceServerException, match="edged-key"):
        client.infer("tiny_mlp", [shm_input], outputs=[shm_output])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [1, 10]), 7.0)
    result = client.infer("tiny_mlp", [shm_input], outputs=[shm_output], headers=HEADERS)
    entry = result.get_output("output")
    assert entry == {"name": "output", "datatype": "FP32", "shape": [1, 10]}  # no data: it is in the region
    got = shm.get_contents_as_numpy(out_handle, np.float32, entry["shape"])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_status_register_and_unregister_follow_triton(served: RunningServer, regions: list[object]) -> None:
    regions.append(shm.create_shared_memory_region("a", _key("a"), 4096))
    assert _register(served, "a", _key("a"), 1024, offset=512)[0] == 200
    status, _, body = served.request("GET", "/v2/systemsharedmemory/region/a/status")
    assert (status, json.loads(body)) == (200, [{"name": "a", "key": _key("a"), "offset": 512, "byte_size": 1024}])
    status, body = _register(served, "a", _key("a"), 16)
    assert status == 400 and "already in manager" in json.loads(body)["error"]  # as Triton 2.51 answers it
    status, _, body = served.request("GET", "/v2/systemsharedmemory/region/nope/status")
    assert status == 404 and "Unable to find system shared memory region: 'nope'" in json.loads(body)["error"]
    assert served.request("POST", "/v2/systemsharedmemory/region/nope/unregister")[0] == 200
    assert served.request("POST", "/v2/systemsharedmemory/region/a/unregister")[0] == 200
    assert json.loads(served.request("GET", "/v2/systemsharedmemory/status")[2]) == []
    assert served.request("GET", "/v2/systemsharedmemory/region/a/register")[0] == 405


@pytest.mark.parametrize(("body", "message"), [
    (b"{}", "no 'key' field"),
    (b'{"key": "/x"}', "no 'byte_size' field"),
    (b'{"key": "/x", "byte_size": -1}', "non-negative"),
    (b'{"key": "/x", "byte_size": 8, "offset": true}', "non-negative"),
    (b"[1]", "JSON object"),
    (b"{", "not valid JSON"),
])
def test_malformed_register_requests_are_400_naming_the_field(served: RunningServer, body: bytes,
                                                              message: str) -> None:
    status, _, answer = served.request("POST", "/v2/systemsharedmemory/region/m/register", body)
    assert status == 400 and message in json.loads(answer)["error"]


@pytest.mark.parametrize("key", ["../../etc/passwd", "/a/b", "/", "", "/..", "/" + "k" * 300, "/no_such_object"])
def test_keys_that_are_not_one_shared_memory_name_are_refused(served: RunningServer, key: str) -> None:
    status, body = _register(served, "k", key, 8)
    assert status == 400, body
    assert json.loads(served.request("GET", "/v2/systemsharedmemory/status")[2]) == []


def test_a_symlink_planted_in_dev_shm_is_not_followed(served: RunningServer) -> None:
    link = Path("/dev/shm") / _key("link").lstrip("/")
    link.symlink_to("/etc/hostname")
    try:
        status, body = _register(served, "link", _key("link"), 4)
    finally:
        link.unlink()
    assert status == 400, body


def test_registration_past_the_end_of_the_object_is_refused(served: RunningServer, regions: list[object]) -> None:
    regions.append(shm.create_shared_memory_region("small", _key("small"), 100))
    status, body = _register(served, "small", _key("small"), 64, offset=50)
    assert status == 400 and "past the end" in json.loads(body)["error"]


def test_out_of_bounds_tensor_references_are_refused_and_the_server_keeps_serving(
        served: RunningServer, regions: list[object]) -> None:
    regions += [shm.create_shared_memory_region("i", _key("i"), FRAME),
                shm.create_shared_memory_region("o", _key("o"), RESULT)]
    assert _register(served, "i", _key("i"), FRAME)[0] == 200
    assert _register(served, "o", _key("o"), RESULT)[0] == 200
    infer = "/v2/models/tiny_mlp/infer"
    cases = {
        "past the region": _infer_body("i", "o", in_offset=8),
        "huge offset": _infer_body("i", "o", in_offset=2**62),
        "wrong size": _infer_body("i", "o", in_size=FRAME - 4),
        "output too small": _infer_body("i", "o", out_size=RESULT - 4),
        "unknown region": _infer_body("nope", "o"),
    }
    for what, body in cases.items():
        status, _, answer = served.request("POST", infer, body)
        assert status == 400, (what, answer)
    assert served.request("POST", infer, _infer_body("i", "o"))[0] == 200


def test_a_truncated_or_unlinked_object_fails_requests_cleanly(served: RunningServer,
                                                               regions: list[object]) -> None:
    for name in ("t", "u", "o2"):
        regions.append(shm.create_shared_memory_region(name, _key(name), FRAME))
        assert _register(served, name, _key(name), FRAME)[0] == 200
    os.truncate(Path("/dev/shm") / _key("t").lstrip("/"), 16)
    status, _, body = served.request("POST", "/v2/models/tiny_mlp/infer", _infer_body("t", "o2"))
    assert status == 400 and "truncated" in json.loads(body)["error"]
    os.unlink(Path("/dev/shm") / _key("u").lstrip("/"))
    status, _, body = served.request("POST", "/v2/models/tiny_mlp/infer", _infer_body("u", "o2"))
    assert status == 400 and "unlinked" in json.loads(body)["error"]
    assert served.request("GET", "/v2/health/ready")[0] == 200


def test_too_many_regions_are_refused_naming_the_limit(served: RunningServer, regions: list[object]) -> None:
    for index in range(5):
        regions.append(shm.create_shared_memory_region(f"n{index}", _key(f"n{index}"), 64))
    answers = [_register(served, f"n{index}", _key(f"n{index}"), 64) for index in range(5)]
    assert [status for status, _ in answers] == [200, 200, 200, 200, 413]
    assert "shm_max_regions" in json.loads(answers[-1][1])["error"]


def test_unregister_releases_the_mapping(served: RunningServer, regions: list[object]) -> None:
    regions.append(shm.create_shared_memory_region("m", _key("m"), 8192))
    assert _register(served, "m", _key("m"), 8192)[0] == 200
    # The server runs in this process, beside the client's own mapping of the object.
    assert Path("/proc/self/maps").read_text().count(_key("m")) == 2
    assert served.request("POST", "/v2/systemsharedmemory/region/m/unregister")[0] == 200
    assert Path("/proc/self/maps").read_text().count(_key("m")) == 1


def test_cuda_shared_memory_is_refused_as_by_a_server_without_gpus(served: RunningServer) -> None:
    assert json.loads(served.request("GET", "/v2/cudasharedmemory/status")[2]) == []
    status, _, body = served.request("POST", "/v2/cudasharedmemory/region/g/register", b"{}")
    assert status == 400 and "GPUs not supported" in json.loads(body)["error"]


_AS_NOBODY = """
import http.client, json, os, socket, sys
os.setgid(65534); os.setuid(65534)
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])
def call(method, path, body=None):
    c = C("localhost"); c.request(method, path, body=body); r = c.getresponse(); return [r.status, r.read().decode()]
print(json.dumps([
    call("POST", "/v2/systemsharedmemory/region/theirs/register",
         json.dumps({"key": sys.argv[2], "byte_size": 256}).encode()),
    call("POST", "/v2/models/tiny_mlp/infer", sys.argv[3].encode()),
    call("GET", "/v2/systemsharedmemory/status"),
    call("POST", "/v2/systemsharedmemory/region/mine_in/unregister"),
    call("POST", "/v2/systemsharedmemory/region/grouped/register",
         json.dumps({"key": sys.argv[4], "byte_size": 256}).encode()),
    call("GET", "/v2/systemsharedmemory/status"),
]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user (nobody)")
def test_another_users_object_and_regions_are_out_of_reach(served: RunningServer, regions: list[object]) -> None:
    regions += [shm.create_shared_memory_region(n, _key(n), FRAME) for n in ("mine_in", "mine_out")]
    assert _register(served, "mine_in", _key("mine_in"), FRAME)[0] == 200
    assert _register(served, "mine_out", _key("mine_out"), RESULT)[0] == 200
    regions.append(shm.create_shared_memory_region("private", _key("private"), 256))  # root's, mode 0600
    regions.append(shm.create_shared_memory_region("grouped", _key("grouped"), 256))
    grouped = Path("/dev/shm") / _key("grouped").lstrip("/")
    os.chown(grouped, 0, 65534)  # given to nobody's group with mode 0660, as the README says to
    grouped.chmod(0o660)
    # A stdlib-only client under the system interpreter: nobody cannot reach a virtual environment under /root.
    python = next(p for p in ("/usr/bin/python3", sys.executable) if os.path.exists(p))
    out = subprocess.run([python, "-c", _AS_NOBODY, str(served.socket_path), _key("private"),
                          _infer_body("mine_in", "mine_out").decode(), _key("grouped")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    register, infer, status, unregister, grouped_register, grouped_status = json.loads(out.stdout)
    assert register[0] == 403 and "neither its owner nor in its group" in register[1]
    assert infer[0] == 403  # root's regions cannot be read or written on behalf of nobody
    assert json.loads(status[1]) == []  # and are not even listed for it
    assert unregister[0] == 403
    assert grouped_register[0] == 200, grouped_register
    assert [r["name"] for r in json.loads(grouped_status[1])] == ["grouped"]
    names = {r["name"] for r in json.loads(served.request("GET", "/v2/systemsharedmemory/status")[2])}
    assert names == {"mine_in", "mine_out", "grouped"}


def _tcp_infer(port: int, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v2/models/tiny_mlp/infer", body, {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize("configured", [False, True], ids=["no-key-configured", "key-configured-not-sent"])
def test_an_infer_request_over_tcp_names_no_region_without_the_shared_memory_key(
        tmp_path: Path, configured: bool) -> None:
    """A region registered over the Unix socket by its owner: a TCP client's infer request that names it (input
    and output) is admitted as inference, but may neither read the region nor write into it without the
    shared-memory key, whether none is configured (shared memory over TCP off) or it is not sent."""
    running = make_server(tmp_path, tcp_restricted={"shared-memory": KEY} if configured else {},
                          models=ModelsConfig(control_mode="explicit", startup_models=("tiny_mlp",)))
    handle = shm.create_shared_memory_region("cam", _key("cam"), 1024 + RESULT)
    try:
        frame = np.random.default_rng(3).random((1, 64), np.float32)
        shm.set_shared_memory_region(handle, [frame])
        shm.set_shared_memory_region(handle, [np.full((1, 10), 7.0, np.float32)], offset=1024)
        assert _register(running, "cam", _key("cam"), 1024 + RESULT)[0] == 200  # its owner, on the Unix socket
        body = json.dumps({
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                        "parameters": {"shared_memory_region": "cam", "shared_memory_byte_size": FRAME}}],
            "outputs": [{"name": "output", "parameters": {"shared_memory_region": "cam", "shared_memory_offset": 1024,
                                                          "shared_memory_byte_size": RESULT}}],
        }).encode()
        status, text = _tcp_infer(running.tcp_port, body)
        assert status == 403, text
        assert ("edged-key" if configured else "shared memory over loopback TCP is off") in text, text
        only_output = json.dumps({  # the input in the body, the output into the region
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": frame.ravel().tolist()}],
            "outputs": [{"name": "output", "parameters": {"shared_memory_region": "cam", "shared_memory_offset": 1024,
                                                          "shared_memory_byte_size": RESULT}}],
        }).encode()
        status, text = _tcp_infer(running.tcp_port, only_output)
        assert status == 403, text
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 10], offset=1024), 7.0)
        if configured:  # with the key it is served, the output written in place
            assert _tcp_infer(running.tcp_port, body, HEADERS)[0] == 200
            assert not np.array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 10], offset=1024),
                                      np.full((1, 10), 7.0, np.float32))
    finally:
        running.stop()
        shm.destroy_shared_memory_region(handle)


def test_an_unregistered_region_is_unmapped_once_a_worker_ran_its_request(tmp_path: Path) -> None:
    """A request run by a worker thread (a batching delay longer than a caller waits out): once it is answered
    and its region unregistered, the daemon maps the object no more and says so in /metrics (a worker waited for
    its next batch still holding the last one's inputs, views of the region, so the mapping outlived its
    unregister until the next request)."""
    running = make_server(tmp_path, models=ModelsConfig(control_mode="explicit"))  # sweeps every second
    key = _key("worker")
    handle = shm.create_shared_memory_region("w", key, FRAME)
    try:
        add_tiny_delay_model(tmp_path / "repo", "tiny_d", 8, 2000)
        assert running.request("POST", "/v2/repository/models/tiny_d/load")[0] == 200
        shm.set_shared_memory_region(handle, [np.ones((1, 64), np.float32)])
        object_name = key.lstrip("/")

        def mappings() -> int:  # the server runs in this process, beside the client's own mapping
            return sum(object_name in line for line in Path("/proc/self/maps").read_text().splitlines())

        clients = mappings()
        assert _register(running, "w", key, FRAME)[0] == 200
        assert mappings() == clients + 1
        body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "parameters": {
            "shared_memory_region": "w", "shared_memory_byte_size": FRAME}}]}).encode()
        status, _, answer = running.request("POST", "/v2/models/tiny_d/infer", body)
        assert status == 200, answer
        assert running.request("POST", "/v2/systemsharedmemory/region/w/unregister")[0] == 200
        deadline = time.monotonic() + 10
        while mappings() > clients and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mappings() == clients, "the unregistered region is still mapped by the server"
        metrics = running.request("GET", "/metrics")[2].decode()
        assert "edged_shm_mapped_bytes 0" in metrics.splitlines()
    finally:
        running.stop()
        shm.destroy_shared_memory_region(handle)
