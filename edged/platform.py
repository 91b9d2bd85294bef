"""Jetson identification (module, L4T release, JetPack label, TensorRT version) from files a tree holds: used by
``edged doctor`` and by OTA's compatibility checks.

Keyed on the L4T triple from /etc/nv_tegra_release; JetPack is only a label looked up from it (tools disagree
at the patch level, see docs/jetson.md §1-2). Every file is optional: a machine without them is not a Jetson.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

_RELEASE = re.compile(r"^#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)\.(\d+)")

# L4T (major, minor, patch) -> JetPack label, from docs/jetson.md §1.
_JETPACK: dict[tuple[int, int, int], str] = {
    (32, 6, 1): "4.6", (32, 7, 1): "4.6.1", (32, 7, 2): "4.6.2", (32, 7, 3): "4.6.3", (32, 7, 4): "4.6.4",
    (32, 7, 5): "4.6.5", (32, 7, 6): "4.6.6",
    (35, 2, 1): "5.1", (35, 3, 1): "5.1.1", (35, 4, 1): "5.1.2", (35, 5, 0): "5.1.3", (35, 6, 0): "5.1.4",
    (35, 6, 1): "5.1.5", (35, 6, 2): "5.1.5", (35, 6, 3): "5.1.5", (35, 6, 4): "5.1.6",
    (36, 2, 0): "6.0 DP", (36, 3, 0): "6.0", (36, 4, 0): "6.1", (36, 4, 2): "6.1 rev1", (36, 4, 3): "6.2",
    (36, 4, 4): "6.2.1", (36, 4, 7): "6.2.1", (36, 5, 0): "6.2.2",
}
_JETPACK_BY_MAJOR = {32: "4.x", 35: "5.x", 36: "6.x", 38: "7.0/7.1", 39: "7.2"}


@dataclass(frozen=True)
class L4TRelease:
    major: int
    minor: int
    patch: int
    board: str | None

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @property
    def jetpack(self) -> str | None:
        exact = _JETPACK.get((self.major, self.minor, self.patch))
        return exact or _JETPACK_BY_MAJOR.get(self.major)


def parse_nv_tegra_release(text: str) -> L4TRelease | None:
    """The release from the file's first line, or None when it is not in the documented form."""
    first = text.splitlines()[0] if text else ""
    match = _RELEASE.match(first)
    if not match:
        return None
    board = re.search(r"BOARD:\s*([^,]+)", first)
    major, minor, patch = (int(g) for g in match.groups())
    return L4TRelease(major, minor, patch, board.group(1).strip() if board else None)


def read_text(root: Path, path: str) -> str | None:
    try:
        return (root / path.lstrip("/")).read_bytes().decode("utf-8", "replace")
    except OSError:
        return None


def module_model(root: Path) -> str | None:
    """/proc/device-tree/model without its trailing NUL; None when absent."""
    text = read_text(root, "/proc/device-tree/model")
    return text.rstrip("\0\n ") or None if text is not None else None


def l4t_release(root: Path) -> tuple[bool, L4TRelease | None]:
    """(file present, parsed release)."""
    text = read_text(root, "/etc/nv_tegra_release")
    return (text is not None, parse_nv_tegra_release(text) if text is not None else None)


def tensorrt_version() -> str:
    """The installed TensorRT Python bindings' version (JetPack's python3-libnvinfer), without importing them."""
    for distribution in ("tensorrt", "tensorrt-cu12", "tensorrt_libs"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return ""
