"""A socket that refuses this user: the message names the socket's own group and does not send the user off to
start a daemon that is running."""

from __future__ import annotations

import errno
import grp
import os
import socket
from pathlib import Path

from edged.client._discovery import connect_failure, unreachable_message


def test_a_refused_socket_names_its_group_and_not_starting_a_daemon(tmp_path: Path) -> None:
    path = tmp_path / "edged.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        group = grp.getgrgid(os.stat(path).st_gid).gr_name
        reason = connect_failure(str(path), PermissionError(errno.EACCES, "Permission denied"))
        assert f"usermod -aG {group} $USER" in reason, reason
        message = unreachable_message((str(path),), reason)
        assert "refused this user" in message and "start the daemon" not in message, message
    gone = connect_failure(str(tmp_path / "nope.sock"), FileNotFoundError(errno.ENOENT, "No such file"))
    assert "start the daemon" in unreachable_message((str(tmp_path / "nope.sock"),), gone)
