"""Durable small files: temp file → fsync → ``os.replace`` → fsync of the directory.

A Jetson loses power at any moment; a reader then finds the old content or the new, never a torn file. The one
implementation for every part that writes state (the clock, the start history, OTA state, model versions).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path | str, data: bytes) -> None:
    """Write ``data`` so that a reader sees the old or the new content, never a part; creates the folder. A
    failure (a full disk) raises OSError and leaves no temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
