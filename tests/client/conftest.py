from __future__ import annotations

from collections.abc import Iterator

import pytest
import server_harness as harness  # tests/server_harness.py, shared by the client and compat tests


@pytest.fixture(scope="session")
def server() -> Iterator[harness.ThreadedServer]:
    running = harness.ThreadedServer().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def explicit_server() -> Iterator[harness.ThreadedServer]:
    """Explicit model control, only tiny_mlp loaded at start: the repository API may load and unload."""
    running = harness.ThreadedServer(control_mode="explicit", startup_models=("tiny_mlp",)).start()
    yield running
    running.stop()
