"""`edged doctor` checks the OTA setup: trusted root present, repository reachable, clock able to judge expiry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edged.cli._doctor_ota import check_ota
from edged.config import OtaConfig
from edged.ota.fleet import FleetRepository
from tests.integration.edged_daemon import daemon_environment
from tests.ota.conftest import Nginx


def _doctor(tmp_path: Path, ota: str) -> dict[str, dict[str, str]]:
    (tmp_path / "edged.toml").write_text(f'[telemetry]\nsource = "off"\n[ota]\nenabled = true\n{ota}')
    done = subprocess.run([sys.executable, "-m", "edged", "doctor", "--json", "--config", str(tmp_path / "edged.toml"),
                           "--socket", str(tmp_path / "none.sock")], capture_output=True, text=True, timeout=120,
                          env=daemon_environment(), check=False)
    return {c["name"]: c for c in json.loads(done.stdout) if c["name"].startswith("ota")}


def test_doctor_reports_a_good_ota_setup(tmp_path: Path, nginx: Nginx, fleet: FleetRepository) -> None:
    found = _doctor(tmp_path, f'repository_url = "{nginx.url}"\nroot_file = "{fleet.metadata_dir}/1.root.json"\n')
    assert found["ota root"]["status"] == "ok" and "root version 1" in found["ota root"]["detail"]
    assert found["ota repository"]["status"] == "ok" and "timestamp version 1" in found["ota repository"]["detail"]
    assert found["ota clock"]["status"] == "ok"


def test_doctor_fails_a_missing_root_and_an_unreachable_repository(tmp_path: Path) -> None:
    found = _doctor(tmp_path, f'repository_url = "http://127.0.0.1:9"\nroot_file = "{tmp_path}/absent.json"\n')
    assert found["ota root"]["status"] == "fail" and "absent.json" in found["ota root"]["detail"]
    assert found["ota repository"]["status"] == "fail"


def test_doctor_says_a_1970_clock_cannot_judge_expiry(nginx: Nginx, fleet: FleetRepository) -> None:
    config = OtaConfig(enabled=True, repository_url=nginx.url, root_file=str(fleet.metadata_dir / "1.root.json"))
    clock = [c for c in check_ota(config, now=86400.0) if c.name == "ota clock"]
    assert clock[0].status == "fail" and "1970-01-02" in clock[0].detail
