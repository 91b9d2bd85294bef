"""Durable small files: every write that matters is temp file → fsync → os.replace → fsync of the directory.

A Jetson loses power at any moment; a reader then finds the old content or the new, never a torn file.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    fsync_dir(path.parent)


def replace_dir(source: Path, destination: Path) -> None:
    """Move a directory into place in one rename (same filesystem), then make the rename durable."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, destination)
    fsync_dir(destination.parent)
    with contextlib.suppress(OSError):
        fsync_dir(source.parent)
