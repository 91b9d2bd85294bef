"""The sidecar beside an engine, the compatibility refusal, version capabilities and the strategy parameter."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from edged.backends._trt_meta import (
    EngineMeta,
    RuntimeIdentity,
    TrtCapabilities,
    check_compatible,
    parse_l4t_release,
    read_l4t_release,
    read_sidecar,
    sidecar_path,
    write_file_atomically,
    write_sidecar,
)
from edged.backends._trt_runtime import parse_allocation_strategy
from edged.errors import ModelLoadError

# The first line of /etc/nv_tegra_release as docs/jetson.md §2 gives it (R36 on JetPack 6.2, R35 on JetPack 5.1.4);
# GCID and DATE vary by build.
JP62 = ("# R36 (release), REVISION: 4.3, GCID: 0, BOARD: generic, EABI: aarch64, "
        "DATE: Wed Jan  8 01:49:37 UTC 2025\n")
JP514 = ("# R35 (release), REVISION: 6.0, GCID: 0, BOARD: t186ref, EABI: aarch64, "
         "DATE: Wed Aug 28 09:11:13 UTC 2024\n")

ORIN = RuntimeIdentity("10.3.0", "Orin", "8.7", "36.4.3")
COMMAND = ("edged", "build-engine", "/models/det/1/model.onnx", "--output", "/models/det/1/model.plan",
           "--precision", "fp16", "--shapes", "images:min=1x3x640x640,opt=4x3x640x640,max=8x3x640x640")


def meta(**kwargs: object) -> EngineMeta:
    base: dict[str, object] = {"tensorrt_version": "10.3.0", "device_name": "Orin", "compute_capability": "8.7",
                               "l4t_release": "36.4.3", "build_flags": {"precision": "fp16"},
                               "source_onnx_sha256": "ab" * 32, "build_command": COMMAND}
    base.update(kwargs)
    return EngineMeta(**base)  # type: ignore[arg-type]


def test_l4t_release_is_read_from_nv_tegra_release(tmp_path: Path) -> None:
    assert parse_l4t_release(JP62) == "36.4.3"
    assert parse_l4t_release(JP514) == "35.6.0"
    assert parse_l4t_release("Ubuntu 22.04") is None
    release = tmp_path / "nv_tegra_release"
    release.write_text(JP62)
    assert read_l4t_release(release) == "36.4.3"
    assert read_l4t_release(tmp_path / "absent") is None


def test_sidecar_round_trips_beside_the_plan(tmp_path: Path) -> None:
    plan = tmp_path / "model.plan"
    written = write_sidecar(plan, meta())
    assert written == sidecar_path(plan) == tmp_path / "model.plan.json"
    assert read_sidecar(plan) == meta()
    assert read_sidecar(tmp_path / "other.plan") is None


def test_unreadable_sidecar_names_the_file_and_what_was_expected(tmp_path: Path) -> None:
    plan = tmp_path / "model.plan"
    sidecar_path(plan).write_text('{"device_name": "Orin"}')
    with pytest.raises(ModelLoadError, match=r"model\.plan\.json: expected a JSON object with tensorrt_version"):
        read_sidecar(plan)


def test_atomic_write_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "model.plan"
    target.write_bytes(b"old")
    write_file_atomically(target, b"new engine")
    assert target.read_bytes() == b"new engine"
    assert [p.name for p in tmp_path.iterdir()] == ["model.plan"]


def test_matching_engine_loads_without_warnings() -> None:
    assert check_compatible(Path("model.plan"), meta(), ORIN) == []


def test_other_tensorrt_version_is_refused_with_the_rebuild_command() -> None:
    here = RuntimeIdentity("10.7.0", "Orin", "8.7", "36.4.3")
    with pytest.raises(ModelLoadError) as info:
        check_compatible(Path("/models/det/1/model.plan"), meta(), here)
    text = str(info.value)
    assert "built with TensorRT 10.3.0, this system has TensorRT 10.7.0" in text
    assert text.endswith(f"rebuild it on this device with: {shlex.join(COMMAND)}")


def test_other_gpu_architecture_is_refused() -> None:
    xavier = RuntimeIdentity("10.3.0", "Xavier", "7.2", "36.4.3")
    with pytest.raises(ModelLoadError, match=r"built for compute capability 8\.7 \(Orin\), this device is 7\.2"):
        check_compatible(Path("model.plan"), meta(), xavier)


def test_version_compatible_engine_only_needs_the_same_major() -> None:
    vc = meta(build_flags={"version_compatible": True})
    assert check_compatible(Path("model.plan"), vc, RuntimeIdentity("10.7.0", "Orin", "8.7", "36.4.3")) == []
    with pytest.raises(ModelLoadError, match=r"TensorRT 8\.6\.2"):
        check_compatible(Path("model.plan"), vc, RuntimeIdentity("8.6.2", "Orin", "8.7", "36.3.0"))


def test_missing_sidecar_is_a_warning_not_a_refusal() -> None:
    (warning,) = check_compatible(Path("/m/model.plan"), None, ORIN)
    assert "no sidecar model.plan.json" in warning


def test_other_module_and_l4t_with_same_architecture_warn() -> None:
    here = RuntimeIdentity("10.3.0", "Orin NX", "8.7", "36.4.4")
    warnings = check_compatible(Path("model.plan"), meta(), here)
    assert len(warnings) == 2 and "Orin NX" in warnings[0] and "36.4.4" in warnings[1]


def test_without_a_recorded_command_the_hint_suggests_one() -> None:
    with pytest.raises(ModelLoadError, match=r"edged build-engine /m/model\.onnx --output /m/model\.plan"):
        check_compatible(Path("/m/model.plan"), meta(build_command=()), RuntimeIdentity("10.7.0", "Orin", "8.7"))


@pytest.mark.parametrize(("version", "strategies", "v2", "monitor"), [
    ("8.5.2.2", False, False, False), ("8.6.2.3", False, False, False), ("10.0.1", True, False, True),
    ("10.3.0", True, True, True), ("10.16.2", True, True, True),
])
def test_capabilities_follow_the_tensorrt_version(version: str, strategies: bool, v2: bool, monitor: bool) -> None:
    caps = TrtCapabilities.from_version(version)
    assert caps.name_based_io
    assert (caps.allocation_strategies, caps.device_memory_v2, caps.progress_monitor) == (strategies, v2, monitor)


def test_allocation_strategy_parameter() -> None:
    trt10 = TrtCapabilities.from_version("10.3.0")
    assert parse_allocation_strategy({}, trt10) == "STATIC"
    key = "execution_context_allocation_strategy"
    assert parse_allocation_strategy({key: "ON_PROFILE_CHANGE"}, trt10) == "ON_PROFILE_CHANGE"
    assert parse_allocation_strategy({key: " user_managed "}, trt10) == "USER_MANAGED"
    with pytest.raises(ModelLoadError, match=r"expected one of STATIC, ON_PROFILE_CHANGE, USER_MANAGED, found 'LAZY'"):
        parse_allocation_strategy({key: "LAZY"}, trt10)


def test_allocation_strategies_other_than_static_need_tensorrt_10() -> None:
    trt86 = TrtCapabilities.from_version("8.6.2")
    key = "execution_context_allocation_strategy"
    assert parse_allocation_strategy({key: "STATIC"}, trt86) == "STATIC"
    with pytest.raises(ModelLoadError, match=r"USER_MANAGED needs TensorRT >= 10\.0.*found TensorRT 8\.6\.2"):
        parse_allocation_strategy({key: "USER_MANAGED"}, trt86)
