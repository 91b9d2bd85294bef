"""edged-update.path and edged-update.service: valid units, the path unit watches the very file the daemon's
hand-off creates, and only the oneshot is privileged (edged.service stays unprivileged with /opt read-only)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edged.ota._release import REQUEST

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_update_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    for name in ("edged-update.service", "edged-update.path"):
        text = (SYSTEMD_DIR / name).read_text()
        # verify checks that ExecStart exists: point it at a real executable
        (tmp_path / name).write_text(text.replace("/opt/edged/current/bin/edged-update", sys.executable))
    result = subprocess.run(["systemd-analyze", "verify", "edged-update.path", "edged-update.service"],
                            cwd=tmp_path, check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


def _settings(name: str) -> list[str]:
    return [line for line in (SYSTEMD_DIR / name).read_text().splitlines() if line and not line.startswith("#")]


def test_the_path_unit_watches_the_daemons_hand_off_and_starts_the_oneshot() -> None:
    path = _settings("edged-update.path")
    assert f"PathExists=/var/lib/edged/ota/release/{REQUEST}" in path  # StateDirectory=edged + ota/release
    assert "Unit=edged-update.service" in path
    service = _settings("edged-update.service")
    assert "Type=oneshot" in service
    assert "ExecStart=/opt/edged/current/bin/edged-update --config /etc/edged/edged.toml" in service
    assert not [line for line in service if line.startswith("User=")]  # root: it writes /opt and the units
    assert "WantedBy=multi-user.target" in service  # at boot: roll back what a power loss interrupted
    daemon = _settings("edged.service")
    assert "User=edged" in daemon and "ReadOnlyPaths=/opt/edged" in daemon and "NoNewPrivileges=yes" in daemon
