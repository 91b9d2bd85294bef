"""`edged doctor --device-report` run as the real command on this CPU machine: the steps this machine can do
ran for real (ONNX Runtime served the bundled model, sysfs telemetry, memory, a hardware-marked test), the
ones it cannot are "skipped: <reason>", and the report is one JSON file plus a readable summary."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from edged.daemon.paths import bundled_models

ROOT = Path(__file__).resolve().parents[2]
STEP_NAMES = {"platform", "onnxruntime", "tensorrt build", "tensorrt vs onnxruntime", "onnxruntime cuda",
              "telemetry tegrastats", "telemetry jtop", "telemetry sysfs", "telemetry sysfs vs tegrastats",
              "memory", "hardware tests"}

pytestmark = pytest.mark.slow


def report(tmp_path: Path, *extra: str) -> tuple[int, dict[str, object], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "edged", "doctor", "--device-report", "out/report.json",
                             *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                            check=False)
    assert "wrote out/report.json and out/report.txt" in result.stdout, result.stdout + result.stderr
    document = json.loads((tmp_path / "out/report.json").read_text())
    return result.returncode, document, (tmp_path / "out/report.txt").read_text()


def test_device_report_runs_what_this_machine_has_and_skips_the_rest_with_reasons(tmp_path: Path) -> None:
    hardware = tmp_path / "hw_tests"
    hardware.mkdir()
    (hardware / "test_probe.py").write_text(
        "import pytest\n\n@pytest.mark.hardware\ndef test_runs():\n    assert sum([1, 1]) == 2\n\n"
        "def test_not_hardware():\n    raise AssertionError('only -m hardware tests run')\n")
    status, document, summary = report(tmp_path, "--tests", str(hardware))
    assert status == 0, summary
    steps = {step["name"]: step for step in document["steps"]}  # type: ignore[attr-defined]
    assert set(steps) == STEP_NAMES
    assert document["summary"] == {s: sum(1 for x in steps.values() if x["status"] == s)
                                   for s in ("ok", "failed", "skipped")}
    for step in steps.values():
        assert step["status"] in ("ok", "failed", "skipped")
        assert step["name"] in summary
        if step["status"] == "skipped":
            assert step["detail"].startswith("skipped: ") and len(step["detail"]) > len("skipped: ")

    # ONNX Runtime served the bundled model for real: its row 0 is what onnxruntime computes for the inputs
    inputs = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    session = onnxruntime.InferenceSession(str(bundled_models() / "digits_onnx/1/model.onnx"))
    expected = session.run(None, {"input": inputs})[0][0]
    served = steps["onnxruntime"]
    assert served["status"] == "ok"
    np.testing.assert_allclose(served["data"]["output_row0"], expected, rtol=1e-5, atol=1e-6)
    assert served["data"]["instances"][0]["providers"]

    memory = steps["memory"]["data"]["points"]
    assert set(memory) == {"before", "loaded", "unloaded"}
    assert all(point["mem_available_kib"] > 0 and point["rss_kib"] > 0 for point in memory.values())
    assert steps["telemetry sysfs"]["status"] == "ok" and steps["telemetry sysfs"]["data"]["ram_total_mb"] > 0
    assert steps["hardware tests"]["status"] == "ok"
    assert steps["hardware tests"]["data"]["counts"]["passed"] == 1
    if importlib.util.find_spec("tensorrt") is None:
        assert steps["tensorrt build"]["detail"].startswith("skipped: TensorRT is not installed")
    if not Path("/usr/bin/tegrastats").exists():
        assert steps["telemetry tegrastats"]["status"] == "skipped"


def test_device_report_without_a_tests_directory_says_how_to_run_them(tmp_path: Path) -> None:
    _, document, _ = report(tmp_path)
    (step,) = [s for s in document["steps"] if s["name"] == "hardware tests"]  # type: ignore[attr-defined]
    assert step["status"] == "skipped" and "--tests" in step["detail"]


def test_device_report_refuses_a_report_name_that_is_not_json(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "edged", "doctor", "--device-report", "report.txt"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode != 0
    assert "--device-report: expected a .json file name, found 'report.txt'" in result.stderr
