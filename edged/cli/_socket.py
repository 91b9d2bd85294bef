"""The options every client command shares (``--socket``, ``--timeout``) and the client built from them.

Socket discovery itself lives in ``edged.client._discovery`` so the CLI and the Python client search the same
paths in the same order; a command that finds no daemon fails with a ServerUnreachable naming each path tried.
"""

from __future__ import annotations

import argparse

from edged.client import EdgedClient
from edged.errors import ConfigError

DEFAULT_TIMEOUT_S = 30.0


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", metavar="PATH", default=None,
                        help="the daemon's Unix socket (default: $EDGED_SOCKET, $RUNTIME_DIRECTORY/edged.sock, "
                        "$XDG_RUNTIME_DIR/edged/edged.sock, /tmp/edged-$UID/edged.sock, /run/edged/edged.sock: "
                        "the first that exists)")
    parser.add_argument("--timeout", metavar="SECONDS", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"give up on an answer after this long (default {DEFAULT_TIMEOUT_S:g})")


def client_from(args: argparse.Namespace) -> EdgedClient:
    timeout: float = args.timeout
    if timeout <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, found {timeout}")
    return EdgedClient(args.socket, timeout_s=timeout)
