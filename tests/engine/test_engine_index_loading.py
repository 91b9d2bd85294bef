"""The repository index while a load runs: the version being loaded is listed LOADING, as Triton lists it (a
client polling for READY saw UNAVAILABLE with no reason, which reads as a failure, for the whole load)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from engine_fakes import BACKENDS, reset
from modelgen import add_custom_model

from edged.config import ModelsConfig
from edged.engine import InferenceService


def _entry(service: InferenceService, name: str) -> dict[str, str]:
    (entry,) = [e for e in service.repository_index() if e["name"] == name]
    return entry


def test_a_version_being_loaded_is_listed_loading_then_ready(tmp_path: Path) -> None:
    reset()
    add_custom_model(tmp_path, "slow", "doubling",
                     'parameters { key: "load_delay_s" value: { string_value: "1.5" } }')
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit", backends=BACKENDS, warmup=False))
    service.start()
    loader = threading.Thread(target=service.load_model, args=("slow",))
    try:
        loader.start()
        seen: list[tuple[str, str]] = []
        deadline = time.monotonic() + 30  # a bound on waiting for the load, not a timed assertion
        while loader.is_alive() and time.monotonic() < deadline:
            entry = _entry(service, "slow")
            if not seen or seen[-1] != (entry["version"], entry["state"]):
                seen.append((entry["version"], entry["state"]))
            time.sleep(0.01)
        loader.join(30)
        assert ("1", "LOADING") in seen, seen
        assert ("", "UNAVAILABLE") not in seen[seen.index(("1", "LOADING")):], seen
        assert _entry(service, "slow") == {"name": "slow", "version": "1", "state": "READY", "reason": ""}
    finally:
        loader.join(30)
        service.close()
