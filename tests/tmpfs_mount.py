"""A real tmpfs of a given size, mounted for one test (full disks, read-only remounts); the test is skipped where
mounting is not allowed (it needs root)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, size: str = "1m", mode: str | None = None) -> Iterator[Path]:
    mount_point.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    options = f"size={size}" + (f",mode={mode}" if mode else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
        if os.path.ismount(mount_point):  # still busy: detach it, the kernel frees it once unused
            subprocess.run(["umount", "-l", str(mount_point)], check=False)
