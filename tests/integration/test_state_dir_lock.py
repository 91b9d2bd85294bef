"""One daemon per state directory: a second `edged serve` on a directory a running daemon holds stops at once with
one error line naming the directory and the holder's PID, and touches nothing there; a daemon killed with SIGKILL
leaves no lock behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from integration.edged_daemon import config_with_fakes, daemon_environment, start_daemon


def _second_serve(tmp_path: Path, state: Path) -> subprocess.CompletedProcess[str]:
    socket_path = tmp_path / "second.sock"
    return subprocess.run([sys.executable, "-m", "edged", "serve", "--socket", str(socket_path), "--state-dir",
                           str(state), "--config", str(tmp_path / "first" / "edged.toml")],
                          capture_output=True, text=True, timeout=90, env=daemon_environment(), check=False)


def test_a_second_daemon_on_the_same_state_dir_exits_naming_the_directory_and_the_holder(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    config = config_with_fakes(f'repository = "{tmp_path / "models"}"\n')
    first = start_daemon(tmp_path / "first", config=config)
    state = tmp_path / "first" / "state"
    try:
        before = {path.name: path.read_bytes() for path in state.iterdir() if path.is_file()}
        second = _second_serve(tmp_path, state)
        assert second.returncode == 1, second.stdout + second.stderr
        assert "Traceback" not in second.stderr, second.stderr
        assert second.stderr.strip().splitlines() == [
            f"edged serve: error: state directory {state} is in use by another edged daemon (PID {first.pid} "
            "holds its edged.lock): stop that daemon first (systemctl stop edged), or give this one a state_dir "
            "(--state-dir) of its own"]
        assert not (tmp_path / "second.sock").exists()  # it stopped before listening
        # nothing under the directory was written by the second one (its start history, clock, lock file)
        assert {path.name: path.read_bytes() for path in state.iterdir() if path.is_file()} == before
        assert first.client().ready()
    finally:
        assert first.stop() == 0, first.output()


def test_a_daemon_killed_with_sigkill_leaves_no_lock_behind(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    config = config_with_fakes(f'repository = "{tmp_path / "models"}"\n')
    first = start_daemon(tmp_path / "run", config=config)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(30)
    assert (tmp_path / "run" / "state" / "edged.lock").exists()  # the file stays; the kernel dropped the lock
    again = start_daemon(tmp_path / "run", config=config)
    try:
        assert again.client().ready()
    finally:
        assert again.stop() == 0, again.output()
