"""Shared fixtures: test helper modules on sys.path, and copies of the bundled sample models."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))  # modelgen and the fakes are imported by name

from modelgen import BUNDLED_MODELS  # noqa: E402


@pytest.fixture
def sample_repo(tmp_path: Path) -> Path:
    """A private copy of models/ (tests may add, change and remove models in it)."""
    target = tmp_path / "models"
    shutil.copytree(BUNDLED_MODELS, target)
    return target


@pytest.fixture(scope="session")
def tarballs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One pair of offline tarballs (0.1.0 and 0.1.0.post1) for every test of the session that installs one:
    a build takes about 25 s, so the packaging tests and the release-update tests share it."""
    from tarball_harness import build

    output = tmp_path_factory.mktemp("dist")
    return build(output), build(output, "--version-suffix", ".post1")
