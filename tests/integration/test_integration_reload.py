"""Reloading a 50 MB model under a memory budget that holds one copy only, through the real daemon's HTTP load
API: the reload follows ``[models] reload`` instead of exceeding the budget, and no load raises the process's
peak RSS (VmHWM, reset before each step through ``/proc/<pid>/clear_refs``) by more than the budget's free part.

Figures are printed (``pytest -s``) for docs/benchmarks.md.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from integration.edged_daemon import DaemonProcess, proc_status_kib, start_daemon
from modelgen import mlp_reference, mlp_weights, write_chain_onnx, write_mlp_onnx

from edged.client import ClientError, EdgedClient, MemoryBudgetError

MIB = 1024 * 1024
BIG_DIM = 3600  # 3600 x 3600 float32 weights: a model file of about 50 MB
# One copy peaks at about 150 MiB while loading and keeps about 100 MiB: the budget holds one copy, not two.
BUDGET_MB = 200
# This model's measured peak is 3.1x its file; glibc's default factor (5.5, for the worst ONNX models seen)
# would refuse its first load under this budget.
ESTIMATE_FACTOR = 3.5
RSS_RELEASE_SLACK_KIB = 16 * 1024


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reload") / "models"
    write_mlp_onnx(root / "big" / "1" / "model.onnx", mlp_weights(BIG_DIM, BIG_DIM, 10))
    # A small model loaded first takes onnxruntime's one-time start-up, which no estimate of "big" covers.
    write_mlp_onnx(root / "warm" / "1" / "model.onnx", mlp_weights(64, 64, 10))
    return root


def _daemon(tmp_path: Path, repo: Path, reload: str) -> DaemonProcess:
    config = (f'[telemetry]\nsource = "off"\n\n[memory]\nbudget_mb = {BUDGET_MB}\n'
              f'load_estimate_factor = {ESTIMATE_FACTOR}\n\n[models]\nreload = "{reload}"\n')
    return start_daemon(tmp_path / reload, config=config,
                        args=["--model-repository", str(repo), "--model-control-mode", "explicit"])


def _peak_rise_kib(daemon: DaemonProcess, client: EdgedClient, what: str) -> tuple[int, int]:
    """Reset VmHWM, load "big"; the rise of the peak over the RSS before and the budget's free part then."""
    free = client.status()["memory"]["free_bytes"]
    Path(f"/proc/{daemon.pid}/clear_refs").write_text("5")
    rss_before = proc_status_kib(daemon.pid, "VmRSS")
    try:
        client.load("big")
    finally:
        rise = proc_status_kib(daemon.pid, "VmHWM") - rss_before
        print(f"\n[peak] {what}: RSS before {rss_before / 1024:.0f} MiB, VmHWM rise {rise / 1024:.0f} MiB, "
              f"budget free part {free / MIB:.0f} MiB")
    return rise, free // 1024


def _load_first_copy(daemon: DaemonProcess) -> EdgedClient:
    client = daemon.client(timeout_s=120)
    client.load("warm")
    client.unload("warm")
    rise, free = _peak_rise_kib(daemon, client, "first load")
    assert rise <= free, f"the first load raised the peak by {rise} KiB, above the free {free} KiB"
    return client


def _assert_serves(client: EdgedClient) -> None:
    x = np.full((1, BIG_DIM), 0.01, np.float32)
    np.testing.assert_allclose(client.infer("big", {"input": x}).as_numpy("output"),
                               mlp_reference(mlp_weights(BIG_DIM, BIG_DIM, 10), x), rtol=1e-3, atol=1e-3)


def test_side_by_side_refuses_a_reload_that_does_not_fit_and_keeps_serving(repo: Path, tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, repo, "side_by_side")
    try:
        client = _load_first_copy(daemon)
        rss_before = proc_status_kib(daemon.pid, "VmRSS")
        with pytest.raises(MemoryBudgetError) as refused:  # 503 with X-Edged-Error: MemoryBudgetExceeded
            _peak_rise_kib(daemon, client, "side_by_side reload (refused)")
        assert refused.value.status == 503
        message = str(refused.value)
        for expected in ("big/1", "needs", f"budget is {BUDGET_MB:.1f} MiB", "in use", "side_by_side"):
            assert expected in message, message
        rise = proc_status_kib(daemon.pid, "VmHWM") - rss_before
        assert rise <= RSS_RELEASE_SLACK_KIB, f"a refused reload raised the peak by {rise} KiB"
        assert proc_status_kib(daemon.pid, "VmRSS") <= rss_before + RSS_RELEASE_SLACK_KIB
        assert client.model_ready("big")
        _assert_serves(client)
        memory = client.status()["memory"]
        assert set(memory["charges"]) == {"big/1"}, memory
    finally:
        assert daemon.stop() == 0, daemon.output()


@pytest.mark.parametrize("policy", ["replace", "auto"])
def test_a_reload_that_does_not_fit_replaces_the_copy_inside_the_budget_and_releases_the_old_one(
        policy: str, repo: Path, tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, repo, policy)
    try:
        client = _load_first_copy(daemon)
        rss_before = proc_status_kib(daemon.pid, "VmRSS")
        rise, free = _peak_rise_kib(daemon, client, f"{policy} reload")
        assert rise <= free, f"the reload raised the peak by {rise} KiB, above the free {free} KiB"
        rss_after = proc_status_kib(daemon.pid, "VmRSS")
        print(f"[peak] {policy} reload: RSS {rss_before / 1024:.0f} -> {rss_after / 1024:.0f} MiB")
        assert rss_after <= rss_before + RSS_RELEASE_SLACK_KIB, "the replaced copy's memory was not released"
        assert client.model_ready("big")
        _assert_serves(client)
        memory = client.status()["memory"]
        assert set(memory["charges"]) == {"big/1"}, memory
        assert memory["used_bytes"] <= BUDGET_MB * MIB
        assert memory["last_load"]["within_budget"] is True, memory["last_load"]
        assert memory["last_load"]["peak_bytes"] > 0
        assert 'edged_model_load_peak_bytes{model="big",version="1"}' in client.metrics()
    finally:
        assert daemon.stop() == 0, daemon.output()


def test_a_failed_reload_keeps_the_old_copy_serving_and_gives_its_memory_back(repo: Path, tmp_path: Path) -> None:
    own = tmp_path / "models"
    shutil.copytree(repo, own)
    daemon = _daemon(tmp_path, own, "side_by_side")
    try:
        client = _load_first_copy(daemon)
        rss_before = proc_status_kib(daemon.pid, "VmRSS")
        (own / "big" / "1" / "model.onnx").write_bytes(b"\x08\x07 not an ONNX model" * 64)
        with pytest.raises(ClientError):
            client.load("big")
        assert client.model_ready("big"), "the old copy keeps serving after a failed reload"
        _assert_serves(client)
        assert proc_status_kib(daemon.pid, "VmRSS") <= rss_before + RSS_RELEASE_SLACK_KIB
        assert set(client.status()["memory"]["charges"]) == {"big/1"}
    finally:
        assert daemon.stop() == 0, daemon.output()


def test_a_model_is_charged_what_it_holds_not_the_heap_its_load_left_behind(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    file_bytes = write_chain_onnx(repo / "chain" / "1" / "model.onnx")
    write_mlp_onnx(repo / "warm" / "1" / "model.onnx", mlp_weights(64, 64, 10))
    config = '[telemetry]\nsource = "off"\n\n[memory]\nbudget_mb = 1024\n'
    daemon = start_daemon(tmp_path / "d", config=config,
                          args=["--model-repository", str(repo), "--model-control-mode", "explicit"])
    try:
        client = daemon.client(timeout_s=120)
        client.load("warm")
        client.unload("warm")
        client.load("chain")
        charge = client.status()["memory"]["charges"]["chain/1"]
        print(f"\n[charge] chain model {file_bytes / MIB:.0f} MiB charged {charge / MIB:.0f} MiB")
        # It holds its weights about twice (parsed + prepacked: ~98 MiB); untrimmed, glibc kept ~80 MiB more.
        assert charge < 3 * file_bytes, f"charged {charge / MIB:.0f} MiB for a {file_bytes / MIB:.0f} MiB model"
    finally:
        assert daemon.stop() == 0, daemon.output()
