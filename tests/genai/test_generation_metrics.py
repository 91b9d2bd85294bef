"""Per-model generation metrics as GenAI-Perf reports them, in ``/metrics`` and the statistics extension, and
energy per output token attributed by telemetry (recorded Orin Nano tegrastats lines replayed) the same way as
energy per inference."""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
import pytest
import server_harness as harness  # tests/server_harness.py
from prometheus_client.parser import text_string_to_metric_families

from edged.config import ModelsConfig, TelemetryConfig
from edged.engine import InferenceService
from edged.engine.generation import GenerationRequest
from edged.engine.generation_stream import Finished
from edged.exposition import render
from edged.telemetry import TelemetryService
from edged.telemetry._replay import ReplaySource

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "tegrastats" / "orin_nano_jp6.log"

CHAT = {"model": "tiny_llama", "messages": [{"role": "user", "content": "Count the tokens."}], "max_tokens": 12,
        "temperature": 0, "stream": True}


def _samples(text: str, name: str) -> dict[tuple[str, ...], float]:
    return {(s.name, *(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model")): s.value
            for f in text_string_to_metric_families(text) if f.name == name
            for s in f.samples if s.labels.get("model") == "tiny_llama"}


def test_metrics_and_statistics_count_what_a_streamed_chat_generated(genai_server: harness.ThreadedServer) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{genai_server.port}") as http:
        before = http.get("/metrics").text
        body = http.post("/v1/chat/completions", json={**CHAT, "stream_options": {"include_usage": True}}).text
        after = http.get("/metrics").text
        stats = http.get("/v2/models/tiny_llama/stats").json()
    usage = [line for line in body.splitlines() if '"usage"' in line][-1]
    generated = int(usage.split('"completion_tokens":')[1].split(",")[0])
    name = "edged_generation_time_to_first_token_seconds"
    count = _samples(after, name)[(f"{name}_count",)] - _samples(before, name).get((f"{name}_count",), 0)
    assert count == 1, "one request, one first token"
    itl = "edged_generation_inter_token_latency_seconds"
    gaps = _samples(after, itl)[(f"{itl}_count",)] - _samples(before, itl).get((f"{itl}_count",), 0)
    assert gaps == generated - 1 + ('"finish_reason":"stop"' in body), "the end-of-sequence token has a gap too"
    output = "edged_generation_output_tokens"
    assert _samples(after, output)[(f"{output}_total",)] >= generated
    assert _samples(after, "edged_generation_requests_in_flight")[("edged_generation_requests_in_flight",)] == 0
    assert _samples(after, "edged_generation_output_tokens_per_second")[
        ("edged_generation_output_tokens_per_second",)] > 0
    generation = stats["model_stats"][0]["generation"]
    assert generation["requests"]["completed"] >= 1 and generation["output_tokens"] >= generated
    assert generation["time_to_first_token"]["count"] >= 1


def test_energy_per_output_token_comes_from_telemetry(tmp_path: Path, model_dir: Path) -> None:
    pytest.importorskip("onnxruntime_genai")
    repository = Path(tempfile.mkdtemp(prefix="edged-energy-"))
    (repository / "tiny_llama").symlink_to(model_dir.parent)
    service = InferenceService(repository, ModelsConfig())
    service.start()
    telemetry = TelemetryService(TelemetryConfig(flush_interval_s=0.2), str(tmp_path / "t.db"), activity=service,
                                 source=ReplaySource(str(RECORDED), speed=100, interval_s=1.0, loop=True))
    service.generation.energy_per_unit_mj = lambda: telemetry.snapshot()["energy_per_inference_mj"]
    request = GenerationRequest("tiny_llama", prompt="Once upon a time", max_tokens=32, temperature=0)
    try:
        list(service.generation.submit(request))  # the model joins the activity: its baseline sample follows
        telemetry.start()
        assert telemetry.wait_samples(3, timeout=60)
        events = [list(service.generation.submit(request)) for _ in range(3)]
        tokens = sum(e[-1].usage.completion_tokens for e in events if isinstance(e[-1], Finished))
        assert telemetry.wait_samples(telemetry.samples + 3, timeout=60)
        per_token = telemetry.snapshot()["energy_per_inference_mj"]["tiny_llama"]
        assert telemetry.snapshot()["inferences"]["tiny_llama"] == tokens, "the unit of work is an output token"
        assert per_token > 0
        text = render(service.generation.metric_families())
        name = "edged_generation_energy_per_output_token_millijoules"
        assert _samples(text, name)[(name,)] == pytest.approx(per_token)
    finally:
        telemetry.stop()
        service.close()
