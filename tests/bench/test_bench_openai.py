"""``edged bench --transport openai`` against a real server with the bundled generative model: GenAI-Perf's
figures from real streamed and whole answers, and scenario keys refused where they would do nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import server_harness as harness  # tests/server_harness.py

from edged.bench import GenResult, Scenario, load_scenarios, report, run_all
from edged.cli.main import main
from edged.errors import ClientError, ConfigError


@pytest.fixture(scope="module")
def genai_server() -> Iterator[harness.ThreadedServer]:
    pytest.importorskip("onnxruntime_genai")
    running = harness.ThreadedServer(models=("tiny_llama",), tcp=True).start()
    yield running
    running.stop()


def _run(server: harness.ThreadedServer, scenario: Scenario, tcp: bool = False) -> list[GenResult]:
    target = {"unix": server.socket_path, "port": server.port if tcp else None}
    rows = run_all([scenario], server.repository, target, lambda message: None)
    assert all(isinstance(row, GenResult) for row in rows)
    return [row for row in rows if isinstance(row, GenResult)]


@pytest.mark.timeout(180)
def test_streaming_rows_report_ttft_itl_and_token_rates_from_the_servers_counts(
        genai_server: harness.ThreadedServer) -> None:
    scenario = Scenario(model="tiny_llama", transport="openai", concurrency=(1, 2), duration_s=1.0, warmup_s=0.2,
                        prompt_tokens=40, output_tokens=8)
    rows = _run(genai_server, scenario)
    assert [(r.transport, r.concurrency, r.stream) for r in rows] == [
        ("openai", 1, True), ("openai", 2, True), ("raw-onnxruntime-genai", 1, True)]
    raw = rows.pop()  # the in-process generator loop on the same folder, the prompt the daemon read
    assert raw.requests > 0 and raw.prompt_tokens == round(rows[0].prompt_tokens) and 1 <= raw.output_tokens <= 8
    assert raw.ttft_p50_ms is not None and 0 < raw.ttft_p50_ms <= raw.latency_p50_ms
    for row in rows:
        assert row.requests > 0 and row.errors == 0
        assert 1 <= row.output_tokens <= 8
        assert row.prompt_tokens == pytest.approx(40, abs=3)  # calibrated on the server's own count
        assert row.ttft_p50_ms is not None and row.ttft_p99_ms is not None
        assert 0 < row.ttft_p50_ms <= row.ttft_p99_ms <= row.latency_p99_ms
        assert row.output_tokens_per_s == pytest.approx(row.output_tokens * row.requests / row.seconds)
        assert row.requests_per_s == pytest.approx(row.requests / row.seconds)
        if row.output_tokens > 1:
            assert row.itl_p50_ms is not None and row.itl_p50_ms > 0
    printed = report(list(rows))
    assert "TTFT p50 ms" in printed and "ITL p99 ms" in printed and "out tok/s" in printed


@pytest.mark.timeout(180)
def test_whole_answers_over_loopback_tcp_report_latency_without_ttft(genai_server: harness.ThreadedServer) -> None:
    scenario = Scenario(model="tiny_llama", transport="openai", duration_s=0.5, warmup_s=0.1, prompt_tokens=20,
                        output_tokens=4, stream=False, compare_raw=False)
    (row,) = _run(genai_server, scenario, tcp=True)
    assert row.requests > 0 and row.errors == 0 and not row.stream
    assert row.ttft_p50_ms is None and row.itl_p50_ms is None and row.latency_p50_ms > 0
    assert "-" in report([row]).splitlines()[2]


@pytest.mark.timeout(180)
def test_cli_writes_generation_rows_as_json(genai_server: harness.ThreadedServer, tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    code = main(["bench", "--transport", "openai", "--socket", genai_server.socket_path, "--duration", "0.5",
                 "--prompt-tokens", "16", "--output-tokens", "4", "--no-raw", "--json", str(out)])
    assert code == 0
    (row,) = json.loads(out.read_text())
    assert row["transport"] == "openai" and row["model"] == "tiny_llama" and row["stream"] is True
    assert row["requests"] > 0 and row["ttft_p50_ms"] > 0


def test_a_model_that_is_not_generative_fails_with_the_servers_reason(genai_server: harness.ThreadedServer) -> None:
    scenario = Scenario(model="nope", transport="openai", duration_s=0.2, prompt_tokens=8, output_tokens=2)
    with pytest.raises(ClientError, match=r"HTTP 404.*nope"):
        _run(genai_server, scenario)


def test_scenario_file_takes_the_generation_keys_and_refuses_them_elsewhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[[scenario]]\ntransport = "openai"\nmodel = "tiny_llama"\nconcurrency = [1, 4]\n'
                    "prompt_tokens = 64\noutput_tokens = 16\nstream = false\n")
    (scenario,) = load_scenarios(good)
    assert scenario.generative == (64, 16, False) and scenario.concurrency == (1, 4)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[[scenario]]\ntransport = "uds"\nstream = true\n')
    with pytest.raises(ConfigError, match="stream apply only to transport openai, not uds"):
        load_scenarios(wrong)
    zero = tmp_path / "zero.toml"
    zero.write_text('[[scenario]]\ntransport = "openai"\noutput_tokens = 0\n')
    with pytest.raises(ConfigError, match="output_tokens must be at least 1, found 0"):
        load_scenarios(zero)
    assert main(["bench", "--transport", "uds", "--prompt-tokens", "8"]) != 0
    assert "prompt_tokens apply only to transport openai, not uds" in capsys.readouterr().err


def test_every_client_makes_at_least_one_request_however_short_the_measurement(
        genai_server: harness.ThreadedServer) -> None:
    scenario = Scenario(model="tiny_llama", transport="openai", concurrency=(3,), duration_s=0.0, warmup_s=0.0,
                        prompt_tokens=8, output_tokens=2)
    rows = _run(genai_server, scenario)
    assert [(r.transport, r.requests, r.errors) for r in rows] == [("openai", 3, 0), ("raw-onnxruntime-genai", 1, 0)]
