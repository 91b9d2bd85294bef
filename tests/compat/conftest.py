from __future__ import annotations

from collections.abc import Iterator

import pytest
import server_harness as harness  # tests/server_harness.py, shared by the client and compat tests


@pytest.fixture(scope="session")
def tcp_server() -> Iterator[harness.ThreadedServer]:
    """The real server on a Unix socket and on a loopback TCP port (``.port``), sample models loaded."""
    running = harness.ThreadedServer(tcp=True).start()
    yield running
    running.stop()


# Loading and unloading over TCP needs a key (server.tcp_restricted): the explicit-mode server has one.
REPOSITORY_KEY = {"edged-key": "compat-test-key"}


@pytest.fixture(scope="module")
def explicit_tcp_server() -> Iterator[harness.ThreadedServer]:
    restricted = {"model-repository": "edged-key=compat-test-key"}
    running = harness.ThreadedServer(control_mode="explicit", startup_models=("tiny_mlp",), tcp=True,
                                     tcp_restricted=restricted).start()
    yield running
    running.stop()
