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
