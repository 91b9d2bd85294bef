"""The shipped units pass systemd's own checks: verify, the offline security score, sysusers and tmpfiles."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
SHIPPED_EXEC_START = "ExecStart=/opt/edged/current/bin/edged serve"
MAX_EXPOSURE = 2.5

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                reason="systemd-analyze not installed")


def _real_edged() -> str:
    edged = Path(sys.executable).with_name("edged")
    if not edged.exists():
        pytest.skip(f"no edged console script next to {sys.executable}; run pip install -e .")
    return str(edged)


@pytest.fixture
def units(tmp_path: Path) -> Path:
    """The units copied, with ExecStart pointed at a real executable (verify checks that it exists)."""
    for name in ("edged.service", "edged.socket", "edged-grpc.socket"):
        shutil.copy(SYSTEMD_DIR / name, tmp_path / name)
    subprocess.run(["sed", "-i", f"s#^ExecStart=/opt/edged/current/bin/edged #ExecStart={_real_edged()} #",
                    str(tmp_path / "edged.service")], check=True)
    return tmp_path


def test_shipped_unit_starts_the_installed_release() -> None:
    text = (SYSTEMD_DIR / "edged.service").read_text()
    assert SHIPPED_EXEC_START in text.splitlines()


def test_units_pass_systemd_analyze_verify(units: Path) -> None:
    result = subprocess.run(["systemd-analyze", "verify", "edged.socket", "edged-grpc.socket", "edged.service"],
                            cwd=units,
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_verify_fails_when_exec_start_is_missing(units: Path) -> None:
    # proves the check above can fail: the shipped path does not exist on a build machine
    shutil.copy(SYSTEMD_DIR / "edged.service", units / "edged.service")
    if Path("/opt/edged/current/bin/edged").exists():
        pytest.skip("edged is installed on this machine")
    result = subprocess.run(["systemd-analyze", "verify", str(units / "edged.service")],
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "/opt/edged/current/bin/edged" in result.stderr


def test_service_exposure_score_is_at_most_2_5(units: Path) -> None:
    result = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager",
                             str(units / "edged.service")],
                            check=False, capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for edged\.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_every_exposure_the_unit_accepts_is_explained_in_a_comment() -> None:
    text = (SYSTEMD_DIR / "edged.service").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    settings = {line.split("=", 1)[0] for line in lines}
    for needed in ("Type", "NotifyAccess", "WatchdogSec", "Restart", "TimeoutStartSec", "TimeoutStopSec",
                   "RuntimeDirectory", "StateDirectory", "ConfigurationDirectory", "LogsDirectory",
                   "SupplementaryGroups", "DeviceAllow", "ProtectSystem", "ProtectHome", "PrivateTmp",
                   "NoNewPrivileges", "RestrictAddressFamilies", "SystemCallFilter", "CapabilityBoundingSet",
                   "LockPersonality", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
                   "RestrictNamespaces", "RestrictRealtime", "StartLimitIntervalSec"):
        assert needed in settings, needed
    assert "MemoryDenyWriteExecute=yes" not in lines  # CUDA's JIT needs W+X mappings
    for unset in ("MemoryDenyWriteExecute", "PrivateDevices", "PrivateUsers", "IPAddressDeny"):
        assert re.search(rf"^#.*{unset}", text, re.MULTILINE), f"no comment explains why {unset} is unset"


def _settings(name: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (SYSTEMD_DIR / name).read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def test_service_never_gives_up_restarting_and_does_not_thrash() -> None:
    settings = _settings("edged.service")
    assert settings["Restart"] == ["always"]
    assert settings["StartLimitIntervalSec"] == ["0"]  # no start limit: systemd 249 has no RestartSteps=
    assert "StartLimitBurst" not in settings
    (restart_sec,) = settings["RestartSec"]
    assert re.fullmatch(r"\d+s", restart_sec) and int(restart_sec[:-1]) >= 5, restart_sec


def test_service_does_not_wait_for_network_online_at_boot() -> None:
    settings = _settings("edged.service")
    ordering = " ".join(settings.get("Wants", []) + settings.get("After", []) + settings.get("Requires", []))
    assert "network-online.target" not in ordering


def test_socket_unit_matches_the_documented_path_and_permissions() -> None:
    lines = set((SYSTEMD_DIR / "edged.socket").read_text().splitlines())
    assert {"ListenStream=/run/edged/edged.sock", "SocketMode=0660", "SocketGroup=edged",
            "FileDescriptorName=edged"} <= lines


def test_grpc_socket_unit_names_its_descriptor_grpc_with_the_http_sockets_permissions() -> None:
    # its own unit: FileDescriptorName= names every socket of a unit, and the HTTP one must stay "edged"
    grpc, http = _settings("edged-grpc.socket"), _settings("edged.socket")
    assert grpc["ListenStream"] == ["/run/edged/grpc.sock"] and grpc["FileDescriptorName"] == ["grpc"]
    assert grpc["Service"] == ["edged.service"]  # a socket triggering the service passes it its descriptor
    for key in ("SocketUser", "SocketGroup", "SocketMode", "DirectoryMode", "RemoveOnStop"):
        assert grpc[key] == http[key], key


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers not installed")
def test_sysusers_creates_the_user_in_the_gpu_groups(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(SYSTEMD_DIR / "sysusers.d/edged.conf")],
                   check=True, capture_output=True, timeout=60)
    passwd = (tmp_path / "etc/passwd").read_text()
    groups = {line.split(":")[0]: line.split(":")[3] for line in (tmp_path / "etc/group").read_text().split()}
    assert re.search(r"^edged:x:\d+:\d+:", passwd, re.MULTILINE)
    assert "edged" in groups["video"].split(",")
    assert "edged" in groups["render"].split(",")


@pytest.mark.skipif(shutil.which("systemd-tmpfiles") is None, reason="systemd-tmpfiles not installed")
def test_tmpfiles_creates_the_documented_directories(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(SYSTEMD_DIR / "sysusers.d/edged.conf")],
                   check=True, capture_output=True, timeout=60)
    subprocess.run(["systemd-tmpfiles", f"--root={tmp_path}", "--create",
                    str(SYSTEMD_DIR / "tmpfiles.d/edged.conf")], check=True, capture_output=True, timeout=60)
    for directory in ("run/edged", "var/lib/edged", "var/log/edged", "etc/edged"):
        assert (tmp_path / directory).is_dir(), directory
        assert (tmp_path / directory).stat().st_mode & 0o777 == 0o750


def test_credentials_drop_in_example_loads_the_mqtt_password() -> None:
    text = (SYSTEMD_DIR / "edged.service.d/mqtt-credentials.conf.example").read_text()
    assert "LoadCredential=mqtt-password:/etc/edged/mqtt-password" in text.splitlines()


@pytest.mark.skipif(shutil.which("systemd-tmpfiles") is None, reason="systemd-tmpfiles not installed")
def test_first_boot_gives_a_staged_config_the_group_edged_reads_it_through(tmp_path: Path) -> None:
    # install.sh --root writes edged.toml root:root (no user edged exists yet); the unit runs as edged
    (tmp_path / "etc/edged").mkdir(parents=True)
    config = tmp_path / "etc/edged/edged.toml"
    config.write_text("# edited\n")
    os.chmod(config, 0o600)
    subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(SYSTEMD_DIR / "sysusers.d/edged.conf")],
                   check=True, capture_output=True, timeout=60)
    subprocess.run(["systemd-tmpfiles", f"--root={tmp_path}", "--create",
                    str(SYSTEMD_DIR / "tmpfiles.d/edged.conf")], check=True, capture_output=True, timeout=60)
    gid = next(int(line.split(":")[2]) for line in (tmp_path / "etc/group").read_text().split()
               if line.startswith("edged:"))
    info = config.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (0, gid, 0o640)
    assert config.read_text() == "# edited\n"
