from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def _load_harness():  # type: ignore[no-untyped-def]
    name = "edged_client_test_harness"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("harness.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


harness = _load_harness()


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
