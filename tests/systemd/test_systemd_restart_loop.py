"""A daemon that systemd restarts forever says when it is restarting in a loop: the start history in the state
directory (device time, real files) and the real daemon's log, sd_notify STATUS= and /v2/edged/status."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from integration.edged_daemon import config_with_fakes, start_daemon
from notify_reader import NotifyReader

from edged.clock import ManualClock
from edged.daemon._restarts import StartHistory


def test_three_unclean_ends_in_the_window_are_a_loop(tmp_path: Path) -> None:
    clock = ManualClock()
    history = StartHistory(tmp_path, clock, window_s=600, loop_starts=3)
    assert history.record_start() is None  # the first start ever: nothing ended uncleanly before it
    for _ in range(2):
        clock.advance(30)
        assert history.record_start() is None
    clock.advance(30)
    loop = history.record_start()
    assert loop is not None
    assert (loop.starts, loop.unclean, loop.previous_run_s) == (4, 3, 30)
    assert loop.message().startswith("restarting in a loop: 4 starts in 10 min, 3 after an unclean end")


def test_clean_stops_and_old_starts_are_no_loop(tmp_path: Path) -> None:
    clock = ManualClock()
    history = StartHistory(tmp_path, clock, window_s=600, loop_starts=3)
    for _ in range(6):  # an operator restarting it: each run stopped cleanly
        history.record_start()
        history.record_clean_stop()
        clock.advance(10)
    assert history.record_start() is None
    for _ in range(3):  # crashes, but each one more than the window after the one before
        clock.advance(700)
        assert history.record_start() is None


def test_a_wall_clock_step_neither_makes_nor_hides_a_loop(tmp_path: Path) -> None:
    clock = ManualClock()
    history = StartHistory(tmp_path, clock, window_s=600, loop_starts=2)
    history.record_start()
    clock.jump_wall(-86_400 * 365)  # the RTC was wrong, NTP fixed it: device time did not move
    clock.advance(5)
    history.record_start()
    clock.jump_wall(86_400 * 365)
    clock.advance(5)
    assert history.record_start() is not None


def test_a_damaged_history_counts_as_none_and_is_rewritten(tmp_path: Path) -> None:
    (tmp_path / "starts.json").write_text("{not json")
    history = StartHistory(tmp_path, ManualClock(), loop_starts=1)
    assert history.record_start() is None
    assert json.loads((tmp_path / "starts.json").read_text())["clean_stop"] is False


def _status_fields(notify: NotifyReader, limit_s: float) -> list[str]:
    """Every STATUS= text until READY=1 arrives."""
    texts: list[str] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        fields = notify.poll(deadline - time.monotonic()) or []
        texts += [f.removeprefix("STATUS=") for f in fields if f.startswith("STATUS=")]
        if "READY=1" in fields:
            return texts
    raise AssertionError(f"no READY=1 within {limit_s} s; STATUS= seen: {texts}")


def test_the_daemon_killed_three_times_says_it_restarts_in_a_loop(tmp_path: Path) -> None:
    config = config_with_fakes(f'repository = "{tmp_path / "models"}"\nwarmup = false\n')
    (tmp_path / "models").mkdir()
    for _ in range(3):  # start, then die uncleanly (what a crash on load or a watchdog abort leaves)
        daemon = start_daemon(tmp_path / "run", config=config)
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(30)
    notify = NotifyReader(tmp_path / "notify.sock")
    try:
        daemon = start_daemon(tmp_path / "run", config=config, env={"NOTIFY_SOCKET": str(notify.path)},
                              wait=False)
        statuses = _status_fields(notify, 90)
    finally:
        notify.close()
    try:
        daemon.wait_ready()
        assert any(text.startswith("restarting in a loop: 4 starts in 10 min") for text in statuses), statuses
        with daemon.client() as client:
            loop = client.status()["restart_loop"]
        assert loop["unclean"] == 3 and loop["message"].startswith("restarting in a loop")
    finally:
        assert daemon.stop() == 0
    assert "restarting in a loop: 4 starts" in daemon.output()
    again = start_daemon(tmp_path / "run", config=config)  # a clean stop ended the loop
    try:
        with again.client() as client:
            assert client.status()["restart_loop"] is None
    finally:
        again.stop()


def test_edged_status_shows_the_restart_loop_line() -> None:
    from edged.cli.status import describe

    lines = describe({"version": "1", "restart_loop": {"message": "restarting in a loop: 4 starts in 10 min"}})
    assert "restarts   restarting in a loop: 4 starts in 10 min" in lines
    assert not any(line.startswith("restarts") for line in describe({"version": "1", "restart_loop": None}))
