"""Peer-credential access control on the Unix socket (the tests run as root, so 'nobody' is someone else)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import make_server

from edged.config import AccessConfig, ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.errors import ConfigError
from edged.protocol import encode_request
from edged.serving import HttpServer

ME = pwd.getpwuid(os.getuid()).pw_name


def _infer(running: object) -> tuple[int, bytes]:
    body, header_length = encode_request({"input": np.ones((1, 64), np.float32)})
    status, _, reply = running.request("POST", "/v2/models/tiny_mlp/infer", body,  # type: ignore[attr-defined]
                                       {"Inference-Header-Content-Length": str(header_length)})
    return status, reply


@pytest.mark.skipif(ME == "nobody", reason="needs to run as someone other than nobody")
def test_callers_outside_the_lists_get_403_logged_and_counted(tmp_path: Path) -> None:
    access = AccessConfig(infer_users=("nobody",), admin_users=("nobody",))
    running = make_server(tmp_path, access=access,
                          models=ModelsConfig(control_mode="explicit", startup_models=("*",)))
    try:
        status, reply = _infer(running)
        assert status == 403
        message = orjson.loads(reply)["error"]
        assert message.startswith(f"permission denied: user {ME} (uid {os.getuid()}) may not run inference")
        status, _, reply = running.request("POST", "/v2/repository/models/tiny_mlp/unload")
        assert status == 403 and "may not unload models" in orjson.loads(reply)["error"]
        assert running.request("GET", "/v2/models/tiny_mlp")[0] == 200  # metadata stays readable
        metrics = running.request("GET", "/metrics")[2].decode()
        assert 'edged_access_denied_total{action="run inference"} 1' in metrics
        assert 'edged_access_denied_total{action="unload models"} 1' in metrics
    finally:
        running.stop()


def test_group_membership_admits_and_admins_may_infer(tmp_path: Path) -> None:
    group = os.getgid()
    import grp
    access = AccessConfig(infer_users=("nobody",), admin_groups=(grp.getgrgid(group).gr_name,))
    running = make_server(tmp_path, access=access)
    try:
        assert _infer(running)[0] == 200
    finally:
        running.stop()


def test_unknown_names_in_the_access_lists_are_config_errors(tmp_path: Path) -> None:
    service = InferenceService(tmp_path, ModelsConfig())
    with pytest.raises(ConfigError, match="unknown user 'no-such-user-x'"):
        HttpServer(service, ServerConfig(access=AccessConfig(infer_users=("no-such-user-x",))))
    with pytest.raises(ConfigError, match="unknown group 'no-such-group-x'"):
        HttpServer(service, ServerConfig(access=AccessConfig(admin_groups=("no-such-group-x",))))
