"""The offline tarball: build it for this machine, install it under a temporary root with no index reachable,
upgrade, roll back, uninstall; run the installed daemon as the unit's ExecStart does, under the sd_notify
protocol; and refuse damaged, foreign or oversized installs without leaving anything."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tarball_harness as harness
from modelgen import add_custom_model
from notify_reader import NotifyReader
from tarball_harness import files_under, mounted_at_opt, run_installed, sh, unpack

from edged.client import ClientError, EdgedClient

# The test backend (engine_fakes.DoublingBackend) that the installed daemon imports through [models] backends.
FAKES = Path(__file__).resolve().parents[1] / "engine"
WATCHDOG_USEC = 1_000_000
PING_INTERVAL_S = WATCHDOG_USEC / 2e6

pytestmark = pytest.mark.slow


def test_tarball_holds_the_documented_layout(tarballs: tuple[Path, Path], tmp_path: Path) -> None:
    first, second = tarballs
    top = unpack(first, tmp_path / "a")
    manifest = json.loads((top / "manifest.json").read_text())
    version = manifest["version"]
    assert first.name == f"edged-{version}-{manifest['platform']}.tar.gz"
    assert top.name == f"edged-{version}"
    names = {p.name for p in top.iterdir()}
    assert {"wheelhouse", "install.sh", "uninstall.sh", "systemd", "edged.toml", "SHA256SUMS",
            "manifest.json"} <= names
    assert manifest["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert any(w.startswith(f"edged-{version}-") for w in manifest["wheels"])
    assert (top / "systemd" / "edged.service").is_file()
    subprocess.run(["sha256sum", "--quiet", "--strict", "-c", "SHA256SUMS"], cwd=top, check=True)
    second_top = unpack(second, tmp_path / "b")
    assert second_top.name == f"edged-{version}.post1"


def test_default_config_parses_to_the_built_in_defaults(tarballs: tuple[Path, Path], tmp_path: Path) -> None:
    from edged.config import EdgedConfig, parse_config

    top = unpack(tarballs[0], tmp_path)
    text = (top / "edged.toml").read_text()
    setting = re.compile(r"^# (\w+ = .*?)(   # .*)?$")  # "#   key = ..." lines are examples
    uncommented = "\n".join(m.group(1) if (m := setting.match(line)) and "(unset)" not in line else line
                            for line in text.splitlines())
    assert "[mqtt]" in text and "[logging]" in text and "[[mqtt.pipelines]]" in text
    assert parse_config(uncommented) == EdgedConfig(source="<config>")


def test_install_upgrade_rollback_uninstall_without_network(tarballs: tuple[Path, Path], tmp_path: Path) -> None:
    first, second = (unpack(t, tmp_path / name) for t, name in zip(tarballs, ("v1", "v2"), strict=True))
    root = tmp_path / "root"
    opt = root / "opt/edged"
    out = sh(first / "install.sh", "--root", str(root)).stdout
    assert "current -> releases/0.1.0" in out
    assert (root / "etc/systemd/system/edged.service").is_file()
    config = root / "etc/edged/edged.toml"
    config.write_text('[logging]\nlevel = "debug"\n')  # the operator's edit

    out = sh(second / "install.sh", "--root", str(root)).stdout
    assert os.readlink(opt / "current") == "releases/0.1.0.post1"
    assert os.readlink(opt / "previous") == "releases/0.1.0"
    with mounted_at_opt(root) as mounted:
        edged = mounted / "current/bin/edged"
        assert b"usage" in run_installed(edged, "--help")
        assert b"0.1.0.post1" in run_installed(edged, "--version")
    assert config.read_text() == '[logging]\nlevel = "debug"\n'
    assert "kept the existing" in out
    assert not list((opt / "releases").glob(".partial-*"))

    sh(second / "install.sh", "--root", str(root), "--rollback")
    assert os.readlink(opt / "current") == "releases/0.1.0"
    assert os.readlink(opt / "previous") == "releases/0.1.0.post1"
    with mounted_at_opt(root) as mounted:
        version = run_installed(mounted / "current/bin/edged", "--version")
    assert version == b"edged 0.1.0\n"

    (root / "var/lib/edged/telemetry.db").write_bytes(b"state")
    before = files_under(root)
    dry = sh(opt / "current/share/edged/uninstall.sh", "--root", str(root), "--dry-run").stdout
    assert files_under(root) == before
    assert f"would run: rm -rf {opt}" in dry and "removed" not in dry  # says what it would do, not what it did
    assert "dry run: nothing was changed" in dry and "would keep the configuration" in dry
    sh(opt / "current/share/edged/uninstall.sh", "--root", str(root))
    assert files_under(root) == {"etc/edged/edged.toml", "var/lib/edged/telemetry.db"}
    sh(second / "uninstall.sh", "--root", str(root), "--purge")
    assert files_under(root) == set()


def _refused(top: Path, root: Path, *args: str) -> str:
    result = sh(top / "install.sh", "--root", str(root), *args, check=False)
    assert result.returncode != 0
    assert not (root / "opt").exists(), "a refused install left files behind"
    return result.stderr


def test_damaged_package_is_refused(tarballs: tuple[Path, Path], tmp_path: Path) -> None:
    top = unpack(tarballs[0], tmp_path / "pkg")
    wheel = next((top / "wheelhouse").glob("edged-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF
    wheel.write_bytes(bytes(data))
    assert "damaged" in _refused(top, tmp_path / "root")


def test_wrong_platform_and_wrong_python_are_refused(tarballs: tuple[Path, Path], tmp_path: Path) -> None:
    top = unpack(tarballs[0], tmp_path / "pkg")
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\necho 3.9\n")
    fake.chmod(0o755)
    assert "built for Python" in _refused(top, tmp_path / "root", "--python", str(fake))
    # a Python that is not there, not executable or not a Python: one line naming it, not bash's own error
    missing = _refused(top, tmp_path / "root", "--python", str(tmp_path / "no-such-python"))
    assert "no-such-python: not an executable file" in missing and "No such file" not in missing
    assert "no such command on PATH" in _refused(top, tmp_path / "root", "--python", "python-nowhere9")
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    assert "does not run as a Python interpreter" in _refused(top, tmp_path / "root", "--python", str(broken))
    manifest = json.loads((top / "manifest.json").read_text())
    manifest["platform"] = "linux_riscv64"
    (top / "manifest.json").write_text(json.dumps(manifest))
    assert "built for linux_riscv64" in _refused(top, tmp_path / "root")


def test_not_enough_space_is_refused_before_anything_is_written(tarballs: tuple[Path, Path],
                                                                tmp_path: Path) -> None:
    top = unpack(tarballs[0], tmp_path / "pkg")
    assert "not enough free space" in _refused(top, tmp_path / "root", "--min-free-mb", "999999999")


def test_failed_pip_install_leaves_nothing_half_installed(tarballs: tuple[Path, Path], tmp_path: Path) -> None:
    top = unpack(tarballs[0], tmp_path / "pkg")
    # a wheelhouse without edged's own wheel (its checksum dropped too): pip fails after the venv exists
    for wheel in (top / "wheelhouse").glob("edged-*.whl"):
        wheel.unlink()
    sums = [line for line in (top / "SHA256SUMS").read_text().splitlines() if "wheelhouse/edged-" not in line]
    (top / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    result = sh(top / "install.sh", "--root", str(tmp_path / "root"), check=False)
    assert result.returncode != 0
    assert "removing the incomplete release" in result.stdout
    assert not (tmp_path / "root/opt").exists(), "a failed install left files behind"


def test_an_install_killed_by_a_power_cut_leaves_no_partial_release_after_the_next_install(
        tarballs: tuple[Path, Path], tmp_path: Path) -> None:
    """kill -9 (a power cut, an OOM kill, edged-update killed) skips install.sh's cleanup: the half-built venv of
    that release stays in releases/.partial-<v>. Before, no later install removed it (prune skipped dot
    folders), so a release never installed again kept hundreds of MB of a Jetson's disk for good."""
    old, new = tarballs
    root = tmp_path / "root"
    sh(unpack(old, tmp_path / "old") / "install.sh", "--root", str(root))
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"} | harness.OFFLINE
    killed = subprocess.Popen([str(unpack(new, tmp_path / "new") / "install.sh"), "--root", str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    partial = root / "opt/edged/releases/.partial-0.1.0.post1"
    deadline = time.monotonic() + 120
    while not (partial / "bin").is_dir():  # the venv is being built
        assert killed.poll() is None and time.monotonic() < deadline, "install.sh ended before it could be killed"
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert partial.is_dir()
    again = sh(unpack(old, tmp_path / "again") / "install.sh", "--root", str(root))  # the next install
    assert not partial.exists(), again.stdout
    assert f"removing the incomplete release {partial}" in again.stdout
    assert sorted(p.name for p in (root / "opt/edged/releases").iterdir()) == ["0.1.0"]
    assert os.readlink(root / "opt/edged/current") == "releases/0.1.0"


def test_dry_run_changes_nothing(tarballs: tuple[Path, Path], tmp_path: Path) -> None:
    top = unpack(tarballs[0], tmp_path / "pkg")
    root = tmp_path / "root"
    out = sh(top / "install.sh", "--root", str(root), "--dry-run").stdout
    assert "would run:" in out
    assert files_under(root) == set()
    shutil.rmtree(root)


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifyReader]:
    reader = NotifyReader(tmp_path / "notify.sock")
    yield reader
    reader.sock.close()


def exec_start(root: Path) -> list[str]:
    """The installed unit's ExecStart (run with the staged tree mounted at /opt/edged)."""
    unit = (root / "etc/systemd/system/edged.service").read_text()
    (line,) = (line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[0] == "/opt/edged/current/bin/edged", line
    return argv


def daemon_config(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    add_custom_model(repo, "doubling", "doubling")
    add_custom_model(repo, "hang", "doubling",
                     extra='parameters { key: "block_until_released" value: { string_value: "true" } }')
    config = tmp_path / "edged.toml"
    # The hang switch is the fake backend's parameter in this test's model repository: nothing in edged knows it.
    config.write_text(f'[telemetry]\nsource = "off"\n\n[models]\nrepository = "{repo}"\nwarmup = false\n'
                      'stall_timeout_s = 0.5\nbackends = { doubling = "engine_fakes:DoublingBackend" }\n\n'
                      '[server]\nshutdown_timeout_s = 1\n')
    return config


def wait_for_silence(notify: NotifyReader, since: float, limit_s: float) -> float:
    """Time of the last WATCHDOG=1 once none has come for two ping periods (what WatchdogSec would notice)."""
    last_ping = since
    while time.monotonic() - last_ping < 2 * WATCHDOG_USEC / 1e6:
        assert time.monotonic() < since + limit_s, f"pings kept coming: {notify.received[-6:]}"
        fields = notify.poll(0.1)
        if fields is not None and "WATCHDOG=1" in fields:
            last_ping = time.monotonic()
    return last_ping


def test_installed_daemon_speaks_sd_notify_serves_and_stops_pinging_when_the_engine_hangs(
        installed: Path, tmp_path: Path, notify: NotifyReader) -> None:
    root = installed
    sock = tmp_path / "edged.sock"
    command = [*exec_start(root), "--config", str(daemon_config(tmp_path)), "--socket", str(sock),
               "--state-dir", str(tmp_path / "state")]
    # As systemd starts it: a clean environment, cwd /, WATCHDOG_PID = the pid that runs ExecStart (sh execs).
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": str(FAKES),
           "NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    with mounted_at_opt(root):  # the staged tree at its real path, as on the device
        log = tmp_path / "edged.log"
        with log.open("wb") as out:
            daemon = subprocess.Popen(["/bin/sh", "-c", 'WATCHDOG_PID=$$ exec "$@"', "sh", *command], env=env,
                                      cwd="/", stdout=out, stderr=subprocess.STDOUT)
        try:
            ready = notify.wait_for("READY=1", 60)
            assert any(f.startswith("STATUS=") for f in ready), ready
            interpreter = Path(f"/proc/{daemon.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            assert interpreter.startswith("/opt/edged/releases/0.1.0/bin/python"), interpreter
            with EdgedClient(sock, timeout_s=30) as client:
                assert client.server_metadata()["version"] == "0.1.0"
                result = client.infer("doubling", {"input": np.arange(4, dtype=np.float32).reshape(1, 4)})
                np.testing.assert_array_equal(result.as_numpy("output"), [[0, 2, 4, 6]])
            first = time.monotonic()
            for _ in range(3):
                notify.wait_for("WATCHDOG=1", 2 * PING_INTERVAL_S + 1)
            assert time.monotonic() - first > 2 * PING_INTERVAL_S * 0.8, "pings far faster than WATCHDOG_USEC/2"

            def submit() -> None:  # the execution never finishes; its fate after the stop does not matter
                with EdgedClient(sock, timeout_s=20) as hanging, contextlib.suppress(ClientError):
                    hanging.infer("hang", {"input": np.ones((1, 4), np.float32)})

            threading.Thread(target=submit, daemon=True).start()
            submitted = time.monotonic()
            last_ping = wait_for_silence(notify, submitted, 15)
            assert last_ping - submitted < 0.5 + 2 * PING_INTERVAL_S + 1, "pings stopped, but far too late"
            assert daemon.poll() is None, "a hang is not a crash: the process must still be there"

            daemon.send_signal(signal.SIGTERM)
            notify.wait_for("STOPPING=1", 10)
            assert daemon.wait(20) == 0
        except BaseException:
            print(log.read_text(errors="replace"))  # pytest shows it with the failure
            raise
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait(10)
        assert "engine wedged: hang/1" in log.read_text(errors="replace")


def test_default_extras_and_the_fleet_root_travel_in_the_package(tmp_path: Path) -> None:
    """ota and grpc are bundled by default; --ota-root puts the fleet's root where install.sh installs it."""
    from edged.ota.fleet import FleetRepository

    FleetRepository.init(tmp_path / "repo")
    root = tmp_path / "repo" / "metadata" / "1.root.json"
    tarball = harness.build(tmp_path / "dist", "--ota-root", str(root))
    top = harness.unpack(tarball, tmp_path / "unpacked")
    manifest = json.loads((top / "manifest.json").read_text())
    assert {"ota", "grpc"} <= set(manifest["extras"])
    wheels = " ".join(manifest["wheels"]).lower()
    assert "tuf-" in wheels and "protobuf-" in wheels and "grpcio-" not in wheels  # the server is edged's own
    assert (top / "ota-root.json").read_bytes() == root.read_bytes()
    staged = tmp_path / "staged"
    harness.sh(top / "install.sh", "--root", str(staged))
    assert (staged / "etc" / "edged" / "ota" / "root.json").read_bytes() == root.read_bytes()


def test_a_file_that_is_not_root_metadata_is_refused_as_the_fleet_root(tmp_path: Path) -> None:
    bogus = tmp_path / "root.json"
    bogus.write_text('{"signed": {"_type": "targets"}, "signatures": []}')
    result = subprocess.run([sys.executable, str(harness.PACKAGING / "build-tarball"), "--platform", "host",
                             "--output", str(tmp_path / "dist"), "--ota-root", str(bogus)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0 and "not TUF root metadata" in result.stderr
