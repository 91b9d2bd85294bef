from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def _load_harness():  # type: ignore[no-untyped-def]
    # tests/client/harness.py, shared with the client tests; the test folders are not packages
    name = "edged_client_test_harness"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "client" / "harness.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


harness = _load_harness()


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
