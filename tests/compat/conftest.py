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


@pytest.fixture(scope="module")
def explicit_tcp_server() -> Iterator[harness.ThreadedServer]:
    running = harness.ThreadedServer(control_mode="explicit", startup_models=("tiny_mlp",), tcp=True).start()
    yield running
    running.stop()
