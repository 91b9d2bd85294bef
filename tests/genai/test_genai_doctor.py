"""``edged doctor`` checks that the onnxruntime-genai build matches the onnxruntime build: on this machine's
real packages (through the real command), and on the facts of the broken installations it must catch."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edged.cli._doctor_genai import GenaiFacts, check_genai, judge_genai

SITE = "/opt/edged/current/lib/python3.10/site-packages"
GOOD = GenaiFacts("0.18.0", False, ("onnxruntime>=1.31.0",), "onnxruntime", "1.32.0", ("CPUExecutionProvider",),
                  f"{SITE}/onnxruntime", (f"{SITE}/onnxruntime/capi/libonnxruntime.so.1.32.0",))


def test_this_machines_packages_match_through_the_real_command() -> None:
    pytest.importorskip("onnxruntime_genai")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run([sys.executable, "-m", "edged.cli.main", "doctor", "--json"], capture_output=True,
                            text=True, env=env, timeout=120, check=False)
    found = [c for c in json.loads(result.stdout) if c["name"] == "ONNX Runtime GenAI"]
    assert len(found) == 1 and found[0]["status"] == "ok", found
    assert found[0]["detail"].startswith("onnxruntime-genai 0.18") and " over onnxruntime 1." in found[0]["detail"]
    assert check_genai(jetson=False).status == "ok"


def test_a_virtual_environment_reached_through_a_symlink_is_one_copy(tmp_path: Path) -> None:
    """/proc/self/maps names the library by its resolved path; the onnxruntime package's folder seen through a
    symlinked venv (a checkout whose .venv links to another) is the same copy, not a second one."""
    pytest.importorskip("onnxruntime_genai")
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix):
        pytest.skip("needs the tests to run in a virtual environment")
    link = tmp_path / "venv-link"
    link.symlink_to(venv.resolve(), target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run([str(link / "bin" / "python"), "-m", "edged.cli.main", "doctor", "--json"],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    found = [c for c in json.loads(result.stdout) if c["name"] == "ONNX Runtime GenAI"]
    assert len(found) == 1 and found[0]["status"] == "ok", found


def test_a_folder_whose_name_only_starts_like_the_package_is_another_copy() -> None:
    check = judge_genai(dataclasses.replace(GOOD, libraries=(f"{SITE}/onnxruntime_old/libonnxruntime.so.1.32.0",)),
                        jetson=False)
    assert check.status == "warn" and "not the onnxruntime package's library" in check.detail


@pytest.mark.parametrize(("change", "status", "words"), [
    ({}, "ok", "onnxruntime-genai 0.18.0 over onnxruntime 1.32.0, CPU"),
    ({"ort_version": "1.30.1"}, "fail", "onnxruntime-genai requires onnxruntime>=1.31.0"),
    ({"ort_distribution": None, "ort_version": None}, "fail", "no onnxruntime package is installed"),
    ({"libraries": ("/usr/lib/libonnxruntime.so.1.32.0", f"{SITE}/onnxruntime/capi/libonnxruntime.so.1.32.0")},
     "fail", "two ONNX Runtime libraries in one process"),
    ({"libraries": ("/usr/local/lib/libonnxruntime.so.1.32.0",)}, "warn", "not the onnxruntime package's library"),
    ({"libraries": (f"{SITE}/onnxruntime/capi/libonnxruntime.so.1.31.0",)}, "fail",
     "the library loaded is ONNX Runtime 1.31.0"),
    ({"genai_cuda": True}, "fail", "a CUDA build of onnxruntime-genai over an onnxruntime without the CUDA"),
    ({"genai_cuda": True, "ort_distribution": "onnxruntime-gpu",
      "ort_providers": ("CUDAExecutionProvider", "CPUExecutionProvider")}, "ok", "over onnxruntime-gpu 1.32.0, CUDA"),
])
def test_mismatched_builds_are_caught(change: dict[str, object], status: str, words: str) -> None:
    check = judge_genai(dataclasses.replace(GOOD, **change), jetson=False)  # type: ignore[arg-type]
    assert (check.status, words in check.detail) == (status, True), check
    assert status == "ok" or check.fix


def test_a_cpu_build_on_a_jetson_is_a_warning() -> None:
    check = judge_genai(GOOD, jetson=True)
    assert check.status == "warn" and "does not use the GPU" in check.detail
