"""The offline tarball: build it for this machine, install it under a temporary root with no index reachable,
upgrade, roll back, uninstall; and refuse damaged, foreign or oversized installs without leaving anything."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null"}

pytestmark = pytest.mark.slow


def build(output: Path, *extra: str) -> Path:
    result = subprocess.run([sys.executable, str(PACKAGING / "build-tarball"), "--platform", "host",
                             "--output", str(output), *extra], capture_output=True, text=True, timeout=600,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[7/7] done" in result.stderr  # progress is shown
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tarballs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    output = tmp_path_factory.mktemp("dist")
    return build(output), build(output, "--version-suffix", ".post1")


def unpack(tarball: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(where, filter="data")
    (top,) = where.iterdir()
    return top


def sh(script: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **OFFLINE}
    result = subprocess.run([str(script), *args], capture_output=True, text=True, env=env, timeout=300,
                            check=False)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


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
    edged = opt / "current/bin/edged"
    assert subprocess.run([str(edged), "--help"], capture_output=True, check=True, timeout=120).returncode == 0
    assert b"0.1.0" in subprocess.run([str(edged), "--version"], capture_output=True, check=True).stdout
    assert (root / "etc/systemd/system/edged.service").is_file()
    config = root / "etc/edged/edged.toml"
    config.write_text('[logging]\nlevel = "debug"\n')  # the operator's edit

    out = sh(second / "install.sh", "--root", str(root)).stdout
    assert os.readlink(opt / "current") == "releases/0.1.0.post1"
    assert os.readlink(opt / "previous") == "releases/0.1.0"
    assert b"0.1.0.post1" in subprocess.run([str(edged), "--version"], capture_output=True, check=True).stdout
    assert config.read_text() == '[logging]\nlevel = "debug"\n'
    assert "kept the existing" in out
    assert not list((opt / "releases").glob(".partial-*"))

    sh(second / "install.sh", "--root", str(root), "--rollback")
    assert os.readlink(opt / "current") == "releases/0.1.0"
    assert os.readlink(opt / "previous") == "releases/0.1.0.post1"
    version = subprocess.run([str(edged), "--version"], capture_output=True, check=True).stdout
    assert version == b"edged 0.1.0\n"

    (root / "var/lib/edged/telemetry.db").write_bytes(b"state")
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


def test_dry_run_changes_nothing(tarballs: tuple[Path, Path], tmp_path: Path) -> None:
    top = unpack(tarballs[0], tmp_path / "pkg")
    root = tmp_path / "root"
    out = sh(top / "install.sh", "--root", str(root), "--dry-run").stdout
    assert "would run:" in out
    assert files_under(root) == set()
    shutil.rmtree(root)
