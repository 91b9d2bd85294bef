"""What pyproject.toml tells setuptools to ship exists: a pattern that matches nothing advertises a file the
wheel does not have."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (JetPack 6)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_data_and_data_files_entry_matches_a_file() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, patterns in tool.get("package-data", {}).items():
        for pattern in patterns:
            assert list((ROOT / package.replace(".", "/")).glob(pattern)), f"package-data {package}: {pattern}"
    for target, files in tool.get("data-files", {}).items():
        for name in files:
            assert (ROOT / name).is_file(), f"data-files {target}: {name}"
