"""Where the daemon keeps things: systemd's directories under a unit, the user's XDG directories otherwise."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import edged


def state_dir(configured: str | None, environ: Mapping[str, str]) -> Path:
    """``state_dir`` from the config, else $STATE_DIRECTORY (systemd), else $XDG_STATE_HOME/edged."""
    if configured:
        return Path(configured)
    if environ.get("STATE_DIRECTORY"):
        return Path(environ["STATE_DIRECTORY"].split(":")[0])
    base = environ.get("XDG_STATE_HOME") or os.path.join(environ.get("HOME") or str(Path.home()), ".local",
                                                         "state")
    return Path(base) / "edged"


def bundled_models() -> Path:
    """The sample models: ``models/`` of a source checkout, else the copy installed under sys.prefix."""
    checkout = Path(edged.__file__).resolve().parent.parent / "models"
    if (checkout / "tiny_mlp").is_dir():
        return checkout
    return Path(sys.prefix) / "share" / "edged" / "models"
