"""The real daemon wires telemetry to the generative core: energy per output token appears in ``/metrics`` for
the bundled tiny Llama while recorded Orin Nano tegrastats lines are replayed as the telemetry source."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest
from integration.edged_daemon import start_daemon  # tests/integration/edged_daemon.py
from prometheus_client.parser import text_string_to_metric_families

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "tegrastats" / "orin_nano_jp6.log"
NAME = "edged_generation_energy_per_output_token_millijoules"
CHAT = {"model": "tiny_llama", "messages": [{"role": "user", "content": "Spend some energy."}], "max_tokens": 16,
        "temperature": 0}


def _energy(http: httpx.Client) -> float | None:
    for family in text_string_to_metric_families(http.get("/metrics").text):
        if family.name == NAME:
            return next((s.value for s in family.samples if s.labels.get("model") == "tiny_llama"), None)
    return None


def test_the_daemon_reports_energy_per_output_token(tmp_path: Path, model_dir: Path) -> None:
    pytest.importorskip("onnxruntime_genai")
    repository = tmp_path / "models"
    shutil.copytree(model_dir.parent, repository / "tiny_llama")
    config = (f'[telemetry]\nsource = "replay"\nreplay_file = "{RECORDED}"\nreplay_speed = 50.0\nreplay_loop = true\n'
              f'\n[models]\nrepository = "{repository}"\n')
    daemon = start_daemon(tmp_path / "run", config=config)
    try:
        transport = httpx.HTTPTransport(uds=str(daemon.socket_path))
        with httpx.Client(transport=transport, base_url="http://edged", timeout=60) as http:
            energy = None
            deadline = time.monotonic() + 60  # a bound on waiting for telemetry samples, not a timed assertion
            while energy is None and time.monotonic() < deadline:
                # the first request makes the model known to telemetry; the next ones are attributed energy
                assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
                time.sleep(0.1)
                energy = _energy(http)
            stats = http.get("/v2/edged/telemetry").json()
    finally:
        daemon.stop()
    assert energy is not None and energy > 0, daemon.output()
    assert stats["energy_per_inference_mj"]["tiny_llama"] == pytest.approx(energy)
