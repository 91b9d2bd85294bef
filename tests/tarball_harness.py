"""Build edged's offline tarball for this machine, unpack it, run its scripts offline, and run an installed
tree at its real path (/opt/edged, by a bind mount) the way the device will."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGING = Path(__file__).resolve().parents[1] / "packaging"
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null"}
OPT = Path("/opt/edged")


def build(output: Path, *extra: str) -> Path:
    result = subprocess.run([sys.executable, str(PACKAGING / "build-tarball"), "--platform", "host",
                             "--output", str(output), *extra], capture_output=True, text=True, timeout=600,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[7/7] done" in result.stderr  # progress is shown
    return Path(result.stdout.strip().splitlines()[-1])


def unpack(tarball: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(where, filter="data")
    (top,) = where.iterdir()
    return top


def sh(script: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # Without the test run's PYTHONPATH: a checkout on it holds edged.egg-info once build-tarball has built the
    # wheel there, and pip in install.sh then takes edged as installed and leaves it out of the release.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"} | OFFLINE
    result = subprocess.run([str(script), *args], capture_output=True, text=True, env=env, timeout=300,
                            check=False)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def device_env() -> dict[str, str]:
    """The environment an installed tree runs in: nothing of the test run's (PYTHONPATH would shadow it)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def run_installed(*argv: str | Path) -> bytes:
    """stdout of an installed program run in device_env(); it must succeed."""
    return subprocess.run([str(a) for a in argv], capture_output=True, check=True, timeout=120,
                          env=device_env(), cwd="/").stdout


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def reseal(top: Path) -> None:
    """Rewrite SHA256SUMS after a test changed a file of the unpacked package on purpose."""
    lines = []
    for path in sorted(p for p in top.rglob("*") if p.is_file() and p.name != "SHA256SUMS"):
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.relative_to(top).as_posix()}\n")
    (top / "SHA256SUMS").write_text("".join(lines))


@contextlib.contextmanager
def mounted_at_opt(root: Path) -> Iterator[Path]:
    """``root``/opt/edged bind-mounted at /opt/edged, so the staged tree runs at the path it has on a device."""
    if os.geteuid() != 0:
        pytest.skip("bind-mounting the staged tree at /opt/edged needs root")
    if OPT.exists():
        pytest.skip(f"{OPT} exists on this machine: a real install must not be shadowed")
    OPT.mkdir(parents=True)
    try:
        mount = subprocess.run(["mount", "--bind", str(root / "opt/edged"), str(OPT)], capture_output=True,
                               text=True, check=False)
        if mount.returncode != 0:
            pytest.skip(f"mount --bind is not allowed here: {mount.stderr.strip()}")
        try:
            yield OPT
        finally:
            subprocess.run(["umount", str(OPT)], check=True)
    finally:
        OPT.rmdir()
