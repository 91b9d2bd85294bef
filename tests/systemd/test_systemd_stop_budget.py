"""The whole stop fits one budget below the unit's TimeoutStopSec, however many models are loaded and however
slowly their runtime frees them: unloads run side by side and are abandoned (logged) when the budget ends."""

from __future__ import annotations

import re
from pathlib import Path

from integration.edged_daemon import config_with_fakes, start_daemon
from modelgen import add_custom_model

from edged.config import EdgedConfig

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
MODELS = 20


def test_default_stop_budget_is_below_the_units_stop_timeout() -> None:
    unit = (SYSTEMD_DIR / "edged.service").read_text()
    (timeout,) = re.findall(r"^TimeoutStopSec=(\d+)$", unit, re.MULTILINE)
    server = EdgedConfig().server
    assert server.shutdown_timeout_s < server.stop_timeout_s < int(timeout)


def test_twenty_models_slow_to_free_stop_cleanly_within_the_budget(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    for index in range(MODELS):  # each instance takes a minute to close: serially that is 20 minutes
        add_custom_model(repo, f"slow{index}", "doubling",
                         extra='parameters { key: "close_delay_s" value: { string_value: "60" } }')
    config = config_with_fakes(f'repository = "{repo}"\nwarmup = false\n\n'
                               "[server]\nshutdown_timeout_s = 1\nstop_timeout_s = 3\n")
    daemon = start_daemon(tmp_path / "run", config=config)
    with daemon.client() as client:
        assert sum(1 for m in client.repository_index() if m["state"] == "READY") == MODELS
    # Well inside the 45 s TimeoutStopSec; without the budget the stop would take 20 x 60 s.
    assert daemon.stop(wait_s=40) == 0, daemon.output()
    output = daemon.output()
    assert f"{MODELS} unload(s) abandoned at the budget" in output
    assert "stop budget of" in output and "abandoning the unload of slow" in output
