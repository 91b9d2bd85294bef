"""TensorRT models shipped as ONNX plus a build spec: the device builds its engine while staging, before the test
vectors run. Here TensorRT is absent, so everything up to the build is proven (the spec is found and validated,
the real builder is invoked, its failure refuses the update with the reason, the served version is untouched);
the full build runs on hardware (marked)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from edged.errors import UpdateRejected
from edged.ota.fleet import FleetRepository
from tests.ota.conftest import MODEL, Device, model_folder, vectors_for

TRT_CONFIG = f"""name: "{MODEL}"
platform: "tensorrt_plan"
max_batch_size: 8
input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 64 ] }} ]
output [ {{ name: "output", data_type: TYPE_FP32, dims: [ 10 ] }} ]
"""
SPEC = {"precision": "fp16", "shapes": ["input:min=1x64,opt=4x64,max=8x64"], "workspace_mb": 256}


def _offer(fleet: FleetRepository, tmp: Path, spec: object, config: str = TRT_CONFIG) -> str:
    folder = model_folder(tmp / "src", 2, seed=2, config=config)
    version = folder / "2"
    (version / "build_spec.json").write_text(json.dumps(spec))
    return fleet.add_model(folder, 2, vectors_for(2))


def _unchanged(device: Device) -> None:
    assert device.served_version() == "1"
    assert sorted(p.name for p in (device.repository / MODEL).iterdir()) == ["1", "config.pbtxt"]
    assert not (device.state_dir / "ota" / "staging").exists()


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed: it builds")
def test_the_builder_is_invoked_with_the_spec_and_its_failure_refuses_the_update(
        device: Device, fleet: FleetRepository, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _offer(fleet, tmp_path, SPEC)
    with caplog.at_level("INFO", logger="edged.ota._engine"):
        status = device.agent.check()
    assert status["state"] == "refused", status
    assert status["reason"].startswith("engine build on this device failed: TensorRT is not installed"), status
    assert "engine build: building model.plan from model.onnx (fp16)" in caplog.text
    _unchanged(device)


@pytest.mark.parametrize(("spec", "reason"), [
    ({**SPEC, "precisoin": "fp16"}, "build_spec.json: unknown key 'precisoin'"),
    ({**SPEC, "precision": "fp8"}, "precision: expected one of fp32, fp16, int8, found 'fp8'"),
    ({**SPEC, "shapes": ["input:min=8x64,opt=4x64,max=1x64"]}, "expected min <= opt <= max"),
    ({**SPEC, "calibration_cache": "../" * 30 + "etc/passwd", "precision": "int8"}, "leads outside the model folder"),
    ({**SPEC, "onnx": "missing.onnx"}, "onnx 'missing.onnx': no such file"),
    ({**SPEC, "workspace_mb": "lots"}, "workspace_mb: expected a whole number of MiB"),
])
def test_an_invalid_build_spec_is_refused_before_the_builder_runs(
        device: Device, fleet: FleetRepository, tmp_path: Path, spec: dict[str, object], reason: str) -> None:
    _offer(fleet, tmp_path, spec)
    status = device.agent.check()
    assert status["state"] == "refused" and reason in status["reason"], status["reason"]
    assert not status["reason"].startswith("engine build on this device failed")
    _unchanged(device)


def test_a_build_spec_for_a_model_that_is_not_tensorrt_is_refused(
        device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    from tests.ota.conftest import CONFIG

    _offer(fleet, tmp_path, SPEC, config=CONFIG)
    status = device.agent.check()
    assert status["state"] == "refused"
    assert "an engine is built only for a TensorRT model" in status["reason"], status["reason"]
    _unchanged(device)


def test_the_fleet_tool_checks_a_build_spec_and_bundles_it(fleet: FleetRepository, tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "src", 2, seed=2, config=TRT_CONFIG)
    with pytest.raises(UpdateRejected, match="--build-spec: unknown key 'shape'"):
        fleet.add_model(folder, 2, vectors_for(2), build_spec=json.dumps({"shape": []}).encode())
    name = fleet.add_model(folder, 2, vectors_for(2), build_spec=json.dumps(SPEC).encode())
    import tarfile

    stored = next((fleet.targets_dir / "models" / MODEL).glob("*.2.tar"))
    with tarfile.open(stored) as tar:
        assert json.load(tar.extractfile(f"{MODEL}/2/build_spec.json")) == SPEC  # type: ignore[arg-type]
    assert name == f"models/{MODEL}/2.tar"


@pytest.mark.hardware
@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is None, reason="TensorRT is not installed")
def test_on_hardware_the_engine_is_built_while_staging_and_then_served(
        device: Device, fleet: FleetRepository, tmp_path: Path) -> None:
    _offer(fleet, tmp_path, SPEC)
    status = device.agent.check()
    assert status["state"] == "active", status
    served = device.repository / MODEL / "2"
    assert (served / "model.plan").is_file() and (served / "model.plan.json").is_file()
    assert device.served_version() == "2"
