"""Durable small files: every write that matters is temp file → fsync → os.replace → fsync of the directory.

A Jetson loses power at any moment; a reader then finds the old content or the new, never a torn file.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from edged.durable import fsync_dir, write_atomic

__all__ = ["fsync_dir", "replace_dir", "write_atomic"]


def replace_dir(source: Path, destination: Path) -> None:
    """Move a directory into place in one rename (same filesystem), then make the rename durable."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, destination)
    fsync_dir(destination.parent)
    with contextlib.suppress(OSError):
        fsync_dir(source.parent)
