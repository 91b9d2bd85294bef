"""A wedged backend on the live daemon's surfaces, and at its start.

A run going longer than ``[models] stall_timeout_s`` shows as the "engine" component degraded (naming the model,
its version and how long the run has gone) in ``/v2/edged/status`` and as ``edged_model_run_stalled`` 1 in
``/metrics`` while it lasts, and ok / 0 once it finishes. A warm-up run that hangs at the start counts under the
same limit: that model's load fails with the reason, and the start goes on to the other models and READY.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from integration.edged_daemon import config_with_fakes, start_daemon, wait_for
from modelgen import add_custom_model
from prometheus_client.parser import text_string_to_metric_families

WAIT_S = 60.0


def stalled_gauge(metrics: str) -> dict[tuple[str, str], float]:
    for family in text_string_to_metric_families(metrics):
        if family.name == "edged_model_run_stalled":
            return {(s.labels["model"], s.labels["version"]): s.value for s in family.samples}
    raise AssertionError("no edged_model_run_stalled family in /metrics")


def test_a_run_past_the_stall_timeout_degrades_the_engine_while_it_lasts(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    # each run sleeps 8 s; no warm-up, so the daemon is ready at once and only the test's request runs long
    add_custom_model(repo, "sleepy", "doubling", extra='parameters { key: "delay_s" value: { string_value: "8" } }')
    add_custom_model(repo, "quick", "doubling")
    config = config_with_fakes("warmup = false\nstall_timeout_s = 0.5\n")
    daemon = start_daemon(tmp_path, config=config, args=["--model-repository", str(repo)])
    try:
        client = daemon.client()
        assert client.status()["health"]["state"] == "ok"
        assert stalled_gauge(client.metrics()) == {("sleepy", "1"): 0, ("quick", "1"): 0}

        answered: list[Any] = []
        infer = threading.Thread(target=lambda: answered.append(
            daemon.client().infer("sleepy", {"input": np.ones((1, 4), np.float32)})), daemon=True)
        infer.start()
        health = wait_for(lambda: (h := client.status()["health"])["state"] == "degraded" and h,
                          "the engine degraded", timeout_s=8)
        engine = health["components"]["engine"]
        assert engine["state"] == "degraded"
        assert "model sleepy version 1" in engine["reason"] and "stall_timeout_s" in engine["reason"], engine
        assert "running for" in engine["reason"], engine
        assert "engine degraded" in health["reason"]
        gauge = stalled_gauge(client.metrics())
        assert gauge == {("sleepy", "1"): 1, ("quick", "1"): 0}, gauge
        assert 'edged_component_degraded{component="engine"} 1' in client.metrics()

        infer.join(WAIT_S)
        assert answered, "the slow request never finished"
        health = client.status()["health"]
        assert health["state"] == "ok" and health["components"]["engine"]["state"] == "ok", health
        assert stalled_gauge(client.metrics()) == {("sleepy", "1"): 0, ("quick", "1"): 0}
    finally:
        daemon.stop(wait_s=15)


def test_a_warm_up_that_hangs_fails_that_load_and_the_start_goes_on(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    # the first warm-up run blocks for 30 s (nothing releases it in the daemon); three of them would hold the start
    # for 90 s, and "zzz" (loaded after it: loads run one at a time, in name order) would wait all that time
    add_custom_model(repo, "hang", "doubling",
                     extra='parameters { key: "block_until_released" value: { string_value: "true" } }')
    add_custom_model(repo, "zzz", "doubling")
    config = config_with_fakes("stall_timeout_s = 1\n\n[server]\nshutdown_timeout_s = 1\n")
    daemon = start_daemon(tmp_path, config=config, args=["--model-repository", str(repo)], wait=False)
    try:
        daemon.wait_ready(timeout_s=25)  # far under the 30 s one hung warm-up run would take
        index = {entry["name"]: entry for entry in daemon.client().repository_index()}
        assert index["zzz"]["state"] == "READY", index
        assert index["hang"]["state"] == "FAILED", index
        reason = index["hang"]["reason"]
        assert "model hang version 1" in reason and "warm-up" in reason and "stall_timeout_s" in reason, reason
        assert "model hang version 1" in daemon.output()
        out = daemon.client().infer("zzz", {"input": np.ones((1, 4), np.float32)})
        assert np.array_equal(out.as_numpy("output"), np.full((1, 4), 2, np.float32))
        # the abandoned run's thread does not hold the stop
        assert daemon.stop(wait_s=15) == 0, daemon.output()
    finally:
        daemon.stop(wait_s=5)
