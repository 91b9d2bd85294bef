"""``edged bench --transport mqtt`` end to end: a real mosquitto, a real daemon subprocess, real paho clients."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edged.cli.main import main

pytestmark = pytest.mark.skipif(shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists(),
                                reason="needs the mosquitto broker")


# A bench that ignores --duration hangs here and pytest-timeout ends it: no wall-clock assertion, which would
# fail on a loaded 2-core machine for reasons unrelated to the bench.
@pytest.mark.timeout(120)
def test_bench_mqtt_measures_request_response_and_a_lossless_qos1_pipeline(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["bench", "--transport", "mqtt", "--duration", "1", "--concurrency", "1",
                 "--json", str(tmp_path / "results.json")])

    assert code == 0
    table = capsys.readouterr().out
    assert "mqtt request/response" in table and "mqtt pipeline qos1" in table
    rows = {row["label"]: row for row in json.loads((tmp_path / "results.json").read_text())}
    request, pipeline = rows["mqtt request/response"], rows["mqtt pipeline qos1"]
    assert request["concurrency"] == 1 and request["requests"] > 0 and request["errors"] == 0
    assert 0 < request["p50_us"] < 1_000_000
    assert pipeline["requests"] > 0 and pipeline["throughput"] > 0
    assert pipeline["errors"] == 0, f"{pipeline['errors']} pipeline messages lost or failed"
