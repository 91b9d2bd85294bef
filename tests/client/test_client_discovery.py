"""Socket discovery: the search order, the first existing socket wins, and what the error says when nothing
answers. Real Unix sockets on disk."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from edged.client import EdgedClient, ServerUnreachable, find_sockets, socket_candidates


def test_candidates_follow_the_documented_order() -> None:
    env = {"EDGED_SOCKET": "/a/e.sock", "RUNTIME_DIRECTORY": "/run/x:/run/y", "XDG_RUNTIME_DIR": "/run/user/7"}
    assert socket_candidates(None, env, uid=7) == (
        "/a/e.sock", "/run/x/edged.sock", "/run/user/7/edged/edged.sock", "/tmp/edged-7/edged.sock",
        "/run/edged/edged.sock")


def test_an_explicit_path_is_the_only_candidate() -> None:
    env = {"EDGED_SOCKET": "/a/e.sock"}
    assert socket_candidates("/x/y.sock", env) == ("/x/y.sock",)


def test_without_environment_the_user_and_system_sockets_remain() -> None:
    assert socket_candidates(None, {}, uid=1000) == ("/tmp/edged-1000/edged.sock", "/run/edged/edged.sock")


def test_the_first_existing_socket_is_used(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "missing.sock"
    env = {"EDGED_SOCKET": str(missing), "XDG_RUNTIME_DIR": str(tmp_path / "none"),
           "RUNTIME_DIRECTORY": os.path.dirname(server.socket_path)}
    assert find_sockets(None, env).existing[0] == server.socket_path
    with EdgedClient(environ=env) as client:
        assert client.live()
        assert client.socket_path == server.socket_path


def test_a_stale_socket_file_is_skipped_for_the_next_that_answers(server) -> None:  # type: ignore[no-untyped-def]
    stale_dir = server.directory + "-stale"
    os.mkdir(stale_dir)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(os.path.join(stale_dir, "edged.sock"))
    stale.close()  # the file stays, nobody listens: connect() is refused
    env = {"EDGED_SOCKET": os.path.join(stale_dir, "edged.sock"),
           "RUNTIME_DIRECTORY": os.path.dirname(server.socket_path)}
    with EdgedClient(environ=env) as client:
        assert client.ready()
        assert client.socket_path == server.socket_path
    os.unlink(os.path.join(stale_dir, "edged.sock"))
    os.rmdir(stale_dir)


def test_nothing_answering_names_every_socket_tried_and_how_to_start(tmp_path: Path) -> None:
    refused = tmp_path / "refused.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(refused))
    sock.close()
    env = {"EDGED_SOCKET": str(refused), "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    with pytest.raises(ServerUnreachable) as raised, EdgedClient(environ=env) as client:
        client.live()
    message = str(raised.value)
    for path in socket_candidates(None, env):
        assert path in message
    assert "Connection refused" in message
    assert "edged serve" in message


def test_an_explicit_missing_socket_is_named_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "nothing.sock"
    with pytest.raises(ServerUnreachable, match=r"nothing\.sock: No such file or directory"), \
            EdgedClient(path) as client:
        client.server_metadata()
