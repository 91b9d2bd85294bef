"""Where the daemon keeps things: systemd's directories under a unit, the user's XDG directories otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

import edged


def bundled_models() -> Path:
    """The sample models: ``models/`` of a source checkout, else the copy installed under sys.prefix."""
    checkout = Path(edged.__file__).resolve().parent.parent / "models"
    if (checkout / "tiny_mlp").is_dir():
        return checkout
    return Path(sys.prefix) / "share" / "edged" / "models"
