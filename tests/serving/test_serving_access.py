"""Peer-credential access control on the Unix socket. The tests run as root, and root (like the daemon's own
user) is always an administrator, so other callers are forked client processes that switch to ``nobody`` or
to a user created for the test."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import RunningServer, UnixHTTPConnection, make_server

from edged.clock import ManualClock
from edged.config import AccessConfig, ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.errors import ConfigError, PermissionDenied
from edged.protocol import encode_request
from edged.serving import HttpServer
from edged.serving._access import PEER_CACHE_TTL_S, AccessPolicy, Peer

TEST_USER = "edgedaccesst"
TEST_GROUP = "edgedaccessg"
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="switching a client to another user needs root and useradd")


@pytest.fixture(scope="module")
def test_user() -> Iterator[pwd.struct_passwd]:
    """A real user in a real group of the system's user database, removed afterwards."""
    subprocess.run(["groupadd", "-f", TEST_GROUP], check=True)
    subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", "-G", TEST_GROUP, TEST_USER], check=False)
    try:
        yield pwd.getpwnam(TEST_USER)
    finally:
        subprocess.run(["userdel", TEST_USER], check=False)
        subprocess.run(["groupdel", TEST_GROUP], check=False)


def _open_server(**access: tuple[str, ...]) -> RunningServer:
    """A server whose socket other users can reach: a world-traversable folder, a mode-0666 socket."""
    folder = Path(tempfile.mkdtemp(prefix="edged-acl-", dir="/tmp"))
    folder.chmod(0o755)
    return make_server(folder, socket_mode="0666", access=AccessConfig(**access),
                       models=ModelsConfig(control_mode="explicit", startup_models=("*",)))


def _as_user(user: pwd.struct_passwd, running: RunningServer, method: str, path: str,
             body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One request from a forked process that has become ``user`` (its own groups only)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            conn = UnixHTTPConnection(str(running.socket_path))
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            os.write(write, orjson.dumps([response.status, response.read().decode(errors="replace")]))
        except BaseException as e:
            os.write(write, orjson.dumps([-1, repr(e)]))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        status, text = orjson.loads(pipe.read())
    os.waitpid(pid, 0)
    assert status != -1, text
    return int(status), text


def _infer_request() -> tuple[bytes, dict[str, str]]:
    body, header_length = encode_request({"input": np.ones((1, 64), np.float32)})
    return body, {"Inference-Header-Content-Length": str(header_length)}


def _stop(running: RunningServer) -> None:
    running.stop()
    shutil.rmtree(running.socket_path.parent, ignore_errors=True)


NOBODY = pwd.getpwnam("nobody")


@needs_root
def test_by_default_only_root_and_the_service_user_may_load_and_unload() -> None:
    running = _open_server()
    try:
        body, headers = _infer_request()
        assert _as_user(NOBODY, running, "POST", "/v2/models/tiny_mlp/infer", body, headers)[0] == 200
        status, text = _as_user(NOBODY, running, "POST", "/v2/repository/models/tiny_mlp/unload")
        assert status == 403
        assert orjson.loads(text)["error"] == ("permission denied: user nobody (uid 65534) may not unload models "
                                               "(administrators are root, the daemon's user and server.access "
                                               "admin_users / admin_groups)")
        status, text = _as_user(NOBODY, running, "POST", "/v2/repository/models/tiny_mlp/load")
        assert status == 403 and "may not load models" in text
        assert _as_user(NOBODY, running, "POST", "/v2/repository/index")[0] == 200  # reading stays open
        assert _as_user(NOBODY, running, "GET", "/v2/edged/status")[0] == 200
        assert running.request("POST", "/v2/repository/models/tiny_mlp/unload")[0] == 200  # root may
        metrics = running.request("GET", "/metrics")[2].decode()
        assert 'edged_access_denied_total{action="unload models"} 1' in metrics
    finally:
        _stop(running)


@needs_root
def test_admin_groups_admit_their_members_and_infer_lists_limit_the_others(
        test_user: pwd.struct_passwd) -> None:
    running = _open_server(admin_groups=(TEST_GROUP,), infer_users=("root",))
    try:
        body, headers = _infer_request()
        assert _as_user(test_user, running, "POST", "/v2/models/tiny_mlp/infer", body, headers)[0] == 200
        assert _as_user(test_user, running, "POST", "/v2/repository/models/tiny_mlp/load")[0] == 200
        status, text = _as_user(NOBODY, running, "POST", "/v2/models/tiny_mlp/infer", body, headers)
        assert status == 403 and "user nobody (uid 65534) may not run inference" in text
        assert _as_user(NOBODY, running, "POST", "/v2/repository/models/tiny_mlp/unload")[0] == 403
    finally:
        _stop(running)


@needs_root
def test_a_user_removed_from_an_admin_group_loses_access_within_the_peer_cache_lifetime(
        test_user: pwd.struct_passwd) -> None:
    clock = ManualClock()
    policy = AccessPolicy(AccessConfig(admin_groups=(TEST_GROUP,)), clock=clock)
    peer = Peer(os.getpid(), test_user.pw_uid, test_user.pw_gid)  # what SO_PEERCRED reports for that user
    policy.check(peer, "admin", "load models")
    subprocess.run(["gpasswd", "-d", TEST_USER, TEST_GROUP], check=True, capture_output=True)
    try:
        policy.check(peer, "admin", "load models")  # still within the cache lifetime: no lookup
        clock.advance(PEER_CACHE_TTL_S)
        with pytest.raises(PermissionDenied, match=f"user {TEST_USER} .* may not load models"):
            policy.check(peer, "admin", "load models")
    finally:
        subprocess.run(["gpasswd", "-a", TEST_USER, TEST_GROUP], check=True, capture_output=True)
    assert TEST_USER in grp.getgrnam(TEST_GROUP).gr_mem


def test_unknown_names_in_the_access_lists_are_config_errors(tmp_path: Path) -> None:
    service = InferenceService(tmp_path, ModelsConfig())
    with pytest.raises(ConfigError, match="unknown user 'no-such-user-x'"):
        HttpServer(service, ServerConfig(access=AccessConfig(infer_users=("no-such-user-x",))))
    with pytest.raises(ConfigError, match="unknown group 'no-such-group-x'"):
        HttpServer(service, ServerConfig(access=AccessConfig(admin_groups=("no-such-group-x",))))
