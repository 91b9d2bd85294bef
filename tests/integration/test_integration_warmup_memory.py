"""Warm-up samples are made one at a time: a load's peak memory is one sample's, not the sum of all of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from integration.edged_daemon import proc_status_kib, start_daemon
from modelgen import add_identity_model

ELEMENTS = 16 * 1024 * 1024  # 64 MiB of FP32 per sample
SAMPLE_MIB = ELEMENTS * 4 / 2**20


def _config(samples: int) -> dict[str, Any]:
    return {"name": "ident", "platform": "onnxruntime_onnx", "max_batch_size": 0,
            "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [-1]}],
            "model_warmup": [{"name": f"w{i}", "batch_size": 1, "inputs": {"INPUT": {
                "data_type": "TYPE_FP32", "dims": [ELEMENTS], "random_data": True}}} for i in range(samples)]}


def test_warm_up_samples_are_made_one_at_a_time(tmp_path: Path) -> None:
    """Eight 64 MiB random_data samples were all made before the first ran: 512 MiB at once, and a load request
    naming more (within the 1 MiB override) could take the whole device's memory. Eight samples now peak where
    one does."""
    repo = tmp_path / "repo"
    add_identity_model(repo, "ident", "FP32", max_batch=0)
    daemon = start_daemon(tmp_path, args=["--model-repository", str(repo), "--model-control-mode", "explicit"])
    try:
        with daemon.client(timeout_s=300) as client:
            client.load("ident", config=_config(1))
            one = proc_status_kib(daemon.pid, "VmHWM") / 1024
            client.unload("ident")
            client.load("ident", config=_config(8))
            eight = proc_status_kib(daemon.pid, "VmHWM") / 1024
        assert eight - one < 2 * SAMPLE_MIB, f"one sample peaked at {one:.0f} MiB, eight at {eight:.0f} MiB"
    finally:
        daemon.stop()
