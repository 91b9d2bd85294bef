"""The [ota] section: every key is checked, and a daemon refuses an enabled section it cannot use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edged.config import parse_config
from edged.errors import ConfigError
from tests.integration.edged_daemon import daemon_environment


@pytest.mark.parametrize(("text", "fragment"), [
    ("keep_versions = 1", "ota.keep_versions: expected at least 2"),
    ("max_error_rate = 1.5", "ota.max_error_rate: expected a fraction"),
    ("max_p99_ratio = 0.5", "ota.max_p99_ratio: expected a ratio of at least 1"),
    ("check_interval_s = 0", "ota.check_interval_s: expected a positive number"),
    ("max_bytes_per_s = -1", "ota.max_bytes_per_s: expected zero or a positive number"),
    ("release_health_s = 0", "ota.release_health_s: expected a positive number"),
])
def test_bad_ota_settings_are_refused_naming_the_key(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        parse_config(f"[ota]\n{text}\n")


def test_ota_settings_are_read() -> None:
    config = parse_config('[ota]\nenabled = true\nrepository_url = "http://fleet"\nwatch_s = 30\nkeep_versions = 3\n')
    assert (config.ota.enabled, config.ota.watch_s, config.ota.keep_versions) == (True, 30.0, 3)


def test_a_daemon_with_ota_enabled_and_no_repository_url_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / "edged.toml").write_text('[telemetry]\nsource = "off"\n[ota]\nenabled = true\n')
    done = subprocess.run([sys.executable, "-m", "edged", "serve", "--config", str(tmp_path / "edged.toml"),
                           "--socket", str(tmp_path / "s.sock"), "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=120, env=daemon_environment(), check=False)
    assert done.returncode != 0
    assert (f"edged serve: error: {tmp_path / 'edged.toml'}: [ota] repository_url: needed when [ota] enabled = true"
            in done.stderr), done.stdout + done.stderr
