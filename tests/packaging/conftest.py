"""One pair of tarballs (0.1.0 and 0.1.0.post1) for every packaging test of the session."""

from __future__ import annotations

from pathlib import Path

import pytest
from tarball_harness import build


@pytest.fixture(scope="session")
def tarballs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    output = tmp_path_factory.mktemp("dist")
    return build(output), build(output, "--version-suffix", ".post1")
