"""End to end with real processes: `edged fleet` signs, nginx serves, a real `edged serve` updates itself on
`edged ota check` while a client hammers the model, and not one request fails across the switch."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from edged.client import ClientError
from tests.integration.edged_daemon import daemon_environment, start_daemon
from tests.ota.conftest import MODEL, Nginx, model_folder, vectors_for


def _edged(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=300,
                          env=daemon_environment(), check=False)


class Hammer(threading.Thread):
    def __init__(self, daemon: object) -> None:
        super().__init__(daemon=True)
        self.client = daemon.client(timeout_s=30)  # type: ignore[attr-defined]
        self.stop = threading.Event()
        self.versions: list[str] = []
        self.failures: list[str] = []

    def run(self) -> None:
        x = np.ones((1, 64), np.float32)
        while not self.stop.is_set():
            try:
                self.versions.append(self.client.infer(MODEL, {"input": x}).model_version)
            except ClientError as e:
                self.failures.append(str(e))


def test_a_daemon_updates_on_ota_check_with_no_failed_request(tmp_path: Path) -> None:
    repo = tmp_path / "fleet"
    init = _edged("fleet", "init", str(repo))
    assert init.returncode == 0, init.stderr
    assert "OFFLINE" in init.stdout and "root-1.pem" in init.stdout
    nginx = Nginx(repo, tmp_path / "nginx")
    models = tmp_path / "device-models"
    model_folder(models, 1, seed=1)
    config = f"""[telemetry]
source = "off"
[models]
repository = "{models}"
[ota]
enabled = true
repository_url = "{nginx.url}"
root_file = "{repo}/metadata/1.root.json"
device_id = "device-a"
jitter_s = 0
watch_s = 0
min_requests = 0
"""
    daemon = start_daemon(tmp_path / "daemon", config=config)
    socket = str(daemon.socket_path)
    try:
        hammer = Hammer(daemon)
        hammer.start()
        source = model_folder(tmp_path / "src", 2, seed=2)
        (tmp_path / "vectors.json").write_bytes(vectors_for(2))
        added = _edged("fleet", "add-model", str(repo), str(source), "--version", "2", "--test-vectors",
                       str(tmp_path / "vectors.json"))
        assert added.returncode == 0, added.stderr
        check = _edged("ota", "check", "--socket", socket, "--json")
        assert check.returncode == 0, check.stderr
        assert json.loads(check.stdout)["state"] == "active", check.stdout
        seen = len(hammer.versions)
        while len(hammer.versions) < seen + 50 and hammer.is_alive():
            threading.Event().wait(0.01)
        hammer.stop.set()
        hammer.join(30)
        assert hammer.failures == []
        assert hammer.versions[0] == "1" and hammer.versions[-1] == "2"
        client = daemon.client()
        assert client.status()["ota"]["state"] == "active"
        assert 'edged_ota_state{state="active"} 1' in client.metrics()
        history = _edged("ota", "history", "--socket", socket)
        assert "models/mlp/2.tar  active" in history.stdout, history.stdout
        rollback = _edged("ota", "rollback", "--socket", socket, "--json")
        assert json.loads(rollback.stdout)["state"] == "rolled_back", rollback.stdout + rollback.stderr
        assert client.infer(MODEL, {"input": np.ones((1, 64), np.float32)}).model_version == "1"
    finally:
        daemon.stop()
        nginx.stop()


def test_sigterm_during_a_download_stops_within_the_budget_and_the_target_is_not_condemned(tmp_path: Path) -> None:
    """A restart or a reboot in the middle of an update. Before, the daemon printed "stopped" and then waited for
    the download in its worker thread (minutes at a capped rate: systemd kills it at TimeoutStopSec), and when
    the download ended during the stop, the staging load refused for the stop marked the genuine target bad for
    good ("known bad: the staged version does not load: ... the daemon is stopping")."""
    import json as _json
    import os
    import signal
    import time

    from edged.ota.fleet import FleetRepository

    FleetRepository.init(tmp_path / "fleet")
    fleet = FleetRepository(tmp_path / "fleet")
    nginx = Nginx(fleet.path, tmp_path / "nginx", locations="location /targets/ { limit_rate 20k; }")
    models = tmp_path / "device-models"
    model_folder(models, 1, seed=1)
    fleet.add_model(model_folder(tmp_path / "src", 2, seed=2, hidden=8192), 2, vectors_for(2, hidden=8192))
    config = f"""[telemetry]
source = "off"
[models]
repository = "{models}"
[ota]
enabled = true
repository_url = "{nginx.url}"
root_file = "{fleet.metadata_dir}/1.root.json"
device_id = "device-a"
jitter_s = 0
min_bytes_per_s = 0
"""
    daemon = start_daemon(tmp_path / "daemon", config=config)  # its first check starts at once (jitter 0)
    try:
        client = daemon.client()
        deadline = time.monotonic() + 60
        while client.status()["ota"]["download"]["received_bytes"] == 0:  # 2.4 MB at 20 kB/s: two minutes
            assert time.monotonic() < deadline, client.status()["ota"]
            time.sleep(0.1)
        began = time.monotonic()
        os.kill(daemon.pid, signal.SIGTERM)
        daemon.process.wait(60)
        assert time.monotonic() - began < 30, daemon.output()  # [server] stop_timeout_s, below TimeoutStopSec
        assert daemon.process.returncode == 0, daemon.output()
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
        nginx.stop()
    state = _json.loads((tmp_path / "daemon" / "state" / "ota" / "state.json").read_text())
    assert state["bad"] == {}, state
    assert state["current"]["state"] == "downloading", state  # resumed from its partial file at the next start
