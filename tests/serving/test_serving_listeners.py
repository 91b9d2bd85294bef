"""Listeners: socket permissions, stale sockets, systemd socket activation, loopback-only TCP, default paths."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edged.access import is_loopback, set_mode_and_group
from edged.config import ServerConfig
from edged.errors import ConfigError
from edged.serving import default_socket_path, open_listeners


def _close(listeners: list) -> None:  # type: ignore[type-arg]
    for item in listeners:
        item.socket.close()


def test_unix_socket_gets_the_configured_mode(tmp_path: Path) -> None:
    path = tmp_path / "edged.sock"
    listeners = open_listeners(ServerConfig(socket_mode="0600"), path, environ={})
    try:
        assert [item.kind for item in listeners] == ["uds"] and not listeners[0].inherited
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_ISSOCK(path.stat().st_mode)
    finally:
        _close(listeners)


def test_stale_socket_is_replaced_but_a_live_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "edged.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens
    listeners = open_listeners(ServerConfig(), path, environ={})
    try:
        with pytest.raises(ConfigError, match=f"another edged is listening on {path}"):
            open_listeners(ServerConfig(), path, environ={})
    finally:
        _close(listeners)
    path.unlink()
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="not a socket"):
        open_listeners(ServerConfig(), path, environ={})


def test_tcp_listener_is_loopback_only_unless_allowed(tmp_path: Path) -> None:
    listeners = open_listeners(ServerConfig(http_port=0), tmp_path / "a.sock", environ={})
    try:
        assert [item.kind for item in listeners] == ["uds", "tcp"]
        assert listeners[1].address.startswith("127.0.0.1:")
    finally:
        _close(listeners)
    with pytest.raises(ConfigError, match="not a loopback address"):
        open_listeners(ServerConfig(http_port=0, http_host="0.0.0.0"), tmp_path / "b.sock", environ={})


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("localhost", True),
    ("::ffff:127.0.0.1", True),  # how an IPv6 socket that also takes IPv4 names IPv4 loopback
    ("0.0.0.0", False), ("::", False), ("::ffff:0.0.0.0", False), ("192.0.2.2", False), ("fe80::1%eth0", False),
])
def test_the_loopback_rule_of_every_tcp_listener(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_listen_fds_for_another_pid_are_ignored(tmp_path: Path) -> None:
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}
    listeners = open_listeners(ServerConfig(), tmp_path / "edged.sock", environ=env)
    try:
        assert not listeners[0].inherited
    finally:
        _close(listeners)


def test_systemd_socket_activation_uses_the_inherited_socket(tmp_path: Path) -> None:
    path = tmp_path / "activated.sock"
    parent = socket.socket(socket.AF_UNIX)
    parent.bind(str(path))
    parent.listen()
    child = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from edged.config import ServerConfig
        from edged.serving import open_listeners
        found = open_listeners(ServerConfig(), Path({str(tmp_path / 'unused.sock')!r}), environ=os.environ)
        print(found[0].kind, found[0].inherited, found[0].address)
    """)
    # like systemd: the socket at fd 3, LISTEN_PID naming the process that exec()s the daemon (exec keeps it)
    launcher = (f"import os, sys; os.dup2({parent.fileno()}, 3); "
                "os.environ['LISTEN_PID'] = str(os.getpid()); "
                "os.execv(sys.executable, [sys.executable, '-c', sys.argv[1]])")
    out = subprocess.run([sys.executable, "-c", launcher, child],
                         env={**os.environ, "LISTEN_FDS": "1", "LISTEN_FDNAMES": "edged"},
                         pass_fds=(parent.fileno(),), capture_output=True, text=True, timeout=30, check=False)
    parent.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["uds", "True", str(path)]
    assert not (tmp_path / "unused.sock").exists()


def test_default_socket_path_order(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    assert default_socket_path({"RUNTIME_DIRECTORY": str(runtime)}) == runtime / "edged.sock"
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    assert default_socket_path({"XDG_RUNTIME_DIR": str(xdg)}) == xdg / "edged" / "edged.sock"
    assert stat.S_IMODE((xdg / "edged").stat().st_mode) == 0o700
    assert default_socket_path({}) == Path(f"/tmp/edged-{os.getuid()}/edged.sock")
    (tmp_path / "open").mkdir(mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(ConfigError, match="writable by others"):
        default_socket_path({"RUNTIME_DIRECTORY": str(tmp_path / "open")})


def test_the_socket_mode_is_never_set_through_a_symlink(tmp_path: Path) -> None:
    """In a folder another user can write, the socket file can be swapped for a symlink between bind and chmod:
    the chmod (and chown) followed it and gave the file it named the socket's mode and group."""
    target = tmp_path / "secret"
    target.write_text("key")
    target.chmod(0o600)
    link = tmp_path / "edged.sock"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="is not the socket edged bound"):
        set_mode_and_group(link, "0666", None)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    link.unlink()
    target.unlink()
    os.mkfifo(target)
    with pytest.raises(ConfigError, match="is not the socket edged bound"):
        set_mode_and_group(target, "0666", None)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(link))
        set_mode_and_group(link, "0640", None)
        assert stat.S_IMODE(link.lstat().st_mode) == 0o640
