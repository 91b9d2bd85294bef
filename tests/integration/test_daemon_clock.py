"""The daemon owns the device clock of its state directory: it records it at start and on stop, and a restart
within the same boot carries on from the same offset (elapsed time never restarts from zero)."""

from __future__ import annotations

import json
from pathlib import Path

from integration.edged_daemon import start_daemon

from edged.clock import read_boot_id, state_file_in


def test_the_daemon_checkpoints_its_clock_on_stop_and_a_restart_continues_it(tmp_path: Path) -> None:
    config = '[telemetry]\nsource = "off"\n'
    state = tmp_path / "state"
    daemon = start_daemon(tmp_path, config=config)
    started = json.loads(state_file_in(state).read_text())
    assert daemon.stop() == 0
    stopped = json.loads(state_file_in(state).read_text())
    assert stopped["boot_id"] == read_boot_id() and stopped["last_elapsed"] > started["last_elapsed"]
    restarted = start_daemon(tmp_path, config=config)
    try:
        again = json.loads(state_file_in(state).read_text())
        assert again["offset"] == stopped["offset"]  # same boot: CLOCK_BOOTTIME carried on
        assert again["last_elapsed"] >= stopped["last_elapsed"]
    finally:
        restarted.stop()
