"""Peer credentials on the gRPC Unix socket, with Triton's own gRPC client over ``unix://``: the HTTP Unix
socket's rules (``[server.access]``, administrators for load and unload, shared memory as the caller).

The tests run as root, and root is always an administrator, so the other caller is a client subprocess that
imports tritonclient as root and then becomes ``nobody`` (setgid, setuid) before it connects: SO_PEERCRED
reports the credentials of connect time. The socket lives in a world-traversable folder with mode 0666, so
that the socket's mode is not what refuses nobody.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.utils.shared_memory as triton_shm
from integration.edged_daemon import DaemonProcess, config_with_fakes, start_daemon
from tritonclient.utils import InferenceServerException

from edged.shm import MAX_REGION_NAME_BYTES

NOBODY = 65534
FRAME, RESULT = 64 * 4, 10 * 4  # tiny_mlp: FP32 [1, 64] in, FP32 [1, 10] out
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching a client to another user needs root")

# argv: url, uid, gid, then a JSON list of [operation, args...]; prints one [code, message] per operation
# ("OK" or the gRPC status name).
CLIENT = r"""
import json, os, queue, sys
import numpy as np
import tritonclient.grpc as g
from tritonclient.utils import InferenceServerException

from edged.shm import MAX_REGION_NAME_BYTES
url, uid, gid, ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
os.setgroups([]); os.setgid(gid); os.setuid(uid)  # before connecting: SO_PEERCRED is read at connect time
client = g.InferenceServerClient(url)
def tensor():
    t = g.InferInput("input", [1, 64], "FP32"); t.set_data_from_numpy(np.ones((1, 64), np.float32)); return t
def infer_shm(region_in, region_out):
    t = g.InferInput("input", [1, 64], "FP32"); t.set_shared_memory(region_in, 256)
    out = g.InferRequestedOutput("output"); out.set_shared_memory(region_out, 40)
    return client.infer("tiny_mlp", [t], outputs=[out])
def stream():
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error))
    try:
        client.async_stream_infer("tiny_mlp", [tensor()])
    except InferenceServerException:
        pass
    error = answers.get(timeout=30); client.stop_stream()
    if error is not None:
        raise error
def status():
    return sorted(client.get_system_shared_memory_status().regions)
calls = {"live": client.is_server_live, "infer": lambda: client.infer("tiny_mlp", [tensor()]),
         "stream": stream, "unload": lambda: client.unload_model("tiny_mlp"),
         "load": lambda: client.load_model("tiny_mlp"), "status": status,
         "register": lambda name, key: client.register_system_shared_memory(name, key, 256),
         "unregister": client.unregister_system_shared_memory, "infer_shm": infer_shm}
results = []
for op, *args in ops:
    try:
        value = calls[op](*args)
        results.append(["OK", value if isinstance(value, list) else ""])
    except InferenceServerException as e:
        results.append([str(e.status()).rsplit(".", 1)[-1], e.message()])
print(json.dumps(results))
"""


def as_user(url: str, uid: int, gid: int, *ops: list[Any]) -> list[tuple[str, Any]]:
    done = subprocess.run([sys.executable, "-c", CLIENT, url, str(uid), str(gid), json.dumps(ops)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [(code, message) for code, message in json.loads(done.stdout.strip().splitlines()[-1])]


def _daemon(access: str = "") -> Iterator[tuple[DaemonProcess, str]]:
    home = Path(tempfile.mkdtemp(prefix="edged-grpc-acl-", dir="/tmp"))
    home.chmod(0o755)
    socket_path = home / "grpc.sock"
    config = config_with_fakes(f'[server]\ngrpc_port = 0\ngrpc_socket = "{socket_path}"\nsocket_mode = "0666"\n'
                               + access)
    daemon = start_daemon(home / "d", config=config, args=["--model-control-mode", "explicit"])
    try:
        daemon.client().load("tiny_mlp")
        yield daemon, f"unix://{socket_path}"
    finally:
        daemon.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[DaemonProcess, str]]:
    yield from _daemon()


@pytest.fixture
def objects() -> Iterator[list[Any]]:
    handles: list[Any] = []
    yield handles
    for handle in handles:
        triton_shm.destroy_shared_memory_region(handle)


def _key(name: str) -> str:
    return f"/edged_grpc_acl_{os.getpid()}_{name}"


@needs_root
def test_on_the_grpc_socket_administrators_are_judged_by_peer_credentials(served: tuple[DaemonProcess, str]) -> None:
    _, url = served
    results = as_user(url, NOBODY, NOBODY, ["live"], ["infer"], ["stream"], ["unload"], ["load"], ["status"])
    (live, _), (infer, _), (stream, _), unload, (load, load_text), status = results
    assert (live, infer, stream) == ("OK", "OK", "OK")  # inference is open to whoever may connect
    assert unload == ("PERMISSION_DENIED", "permission denied: user nobody (uid 65534) may not unload models "
                                           "(administrators are root, the daemon's user and server.access "
                                           "admin_users / admin_groups)")
    assert load == "PERMISSION_DENIED" and "may not load models" in load_text
    assert status == ("OK", [])  # shared memory needs no key on the socket: the peer is the check
    root = triton_grpc.InferenceServerClient(url)  # root, with no metadata key: an administrator by its uid
    root.unload_model("tiny_mlp")
    root.load_model("tiny_mlp")
    assert root.is_model_ready("tiny_mlp")


def test_over_tcp_the_same_calls_still_need_the_metadata_key(served: tuple[DaemonProcess, str]) -> None:
    daemon, _ = served
    tcp = next(a for a in daemon.client().status()["grpc_listeners"] if not a.startswith("unix:"))
    client = triton_grpc.InferenceServerClient(tcp)  # root's process, but TCP carries no credentials
    before = _denied(daemon)
    with pytest.raises(InferenceServerException, match=r"shared memory over gRPC over TCP is off") as refused:
        client.get_system_shared_memory_status()
    assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
    with pytest.raises(InferenceServerException, match="gRPC over TCP client may not unload models"):
        client.unload_model("tiny_mlp")
    # counted with the HTTP front end's refusals, in the daemon's one edged_access_denied_total
    after = _denied(daemon)
    assert after.get("unload models", 0) == before.get("unload models", 0) + 1, (before, after)
    assert after.get("SystemSharedMemoryStatus", 0) == before.get("SystemSharedMemoryStatus", 0) + 1


def _denied(daemon: DaemonProcess) -> dict[str, float]:
    """edged_access_denied_total by action, from the daemon's /metrics."""
    found = {}
    for line in daemon.client().metrics().splitlines():
        if line.startswith("edged_access_denied_total{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('action="', 1)[1].split('"', 1)[0]] = float(value)
    return found


@needs_root
def test_another_users_shared_memory_object_and_regions_are_refused_over_grpc(
        served: tuple[DaemonProcess, str], objects: list[Any]) -> None:
    _, url = served
    root = triton_grpc.InferenceServerClient(url)
    objects += [triton_shm.create_shared_memory_region(n, _key(n), 256) for n in ("in", "out", "private", "grouped")]
    triton_shm.set_shared_memory_region(objects[0], [np.ones((1, 64), np.float32)])
    root.register_system_shared_memory("root_in", _key("in"), 256)
    root.register_system_shared_memory("root_out", _key("out"), 256)
    grouped = Path("/dev/shm") / _key("grouped").lstrip("/")
    os.chown(grouped, 0, NOBODY)  # given to nobody's group, mode 0660, as the README says to
    grouped.chmod(0o660)
    try:
        register, infer, status, unregister, shared, listed = as_user(
            url, NOBODY, NOBODY, ["register", "theirs", _key("private")], ["infer_shm", "root_in", "root_out"],
            ["status"], ["unregister", "root_in"], ["register", "grouped", _key("grouped")], ["status"])
        assert register[0] == "PERMISSION_DENIED" and "neither its owner nor in its group" in register[1]
        assert infer[0] == "PERMISSION_DENIED" and "registered for another user" in infer[1]
        assert status == ("OK", [])  # root's regions are not even listed for nobody
        assert unregister[0] == "PERMISSION_DENIED"
        assert shared[0] == "OK" and listed == ("OK", ["grouped"])
        assert sorted(root.get_system_shared_memory_status().regions) == ["grouped", "root_in", "root_out"]
        answer = _infer_shm(root, "root_in", "root_out")  # root's own regions still serve root
        assert answer.get_output("output") is not None
    finally:
        root.unregister_system_shared_memory()


def _infer_shm(client: triton_grpc.InferenceServerClient, region_in: str, region_out: str) -> Any:
    tensor = triton_grpc.InferInput("input", [1, 64], "FP32")
    tensor.set_shared_memory(region_in, FRAME)
    output = triton_grpc.InferRequestedOutput("output")
    output.set_shared_memory(region_out, RESULT)
    return client.infer("tiny_mlp", [tensor], outputs=[output])


@needs_root
def test_inference_limited_to_listed_users_is_refused_to_others_on_the_socket_unary_and_stream() -> None:
    for daemon, url in _daemon('\n[server.access]\ninfer_users = ["root"]\n'):
        (infer, text), (stream, _), (live, _) = as_user(url, NOBODY, NOBODY, ["infer"], ["stream"], ["live"])
        assert infer == "PERMISSION_DENIED" and "user nobody (uid 65534) may not run inference" in text
        assert (stream, live) == ("PERMISSION_DENIED", "OK")
        assert triton_grpc.InferenceServerClient(url).infer("tiny_mlp", [_root_input()]) is not None
        tcp = next(a for a in daemon.client().status()["grpc_listeners"] if not a.startswith("unix:"))
        with pytest.raises(InferenceServerException, match=r"server\.access limits it to listed users"):
            triton_grpc.InferenceServerClient(tcp).infer("tiny_mlp", [_root_input()])


def _root_input() -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
    return tensor


def test_a_region_name_longer_than_the_limit_is_refused(served: tuple[DaemonProcess, str], objects: list[Any]) -> None:
    """A region's name is kept as long as the region: 64 regions named by 60 MB gRPC messages held ~4 GB."""


    _, url = served
    client = triton_grpc.InferenceServerClient(url)
    objects.append(triton_shm.create_shared_memory_region("long", _key("long"), 256))
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.register_system_shared_memory("n" * (4 << 20), _key("long"), 256)
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", refused.value.message()
        assert f"longer than {MAX_REGION_NAME_BYTES} bytes" in refused.value.message()
        assert len(refused.value.message()) < 2000
        assert client.get_system_shared_memory_status().regions == {}
        client.register_system_shared_memory("n" * MAX_REGION_NAME_BYTES, _key("long"), 256)
    finally:
        client.unregister_system_shared_memory()
