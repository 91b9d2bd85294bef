"""Shared fixtures: test helper modules on sys.path, and copies of the bundled sample models; the work units of
parallel runs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))  # modelgen and the fakes are imported by name

from modelgen import BUNDLED_MODELS  # noqa: E402

# Parallel runs (``./dev test`` runs two pytest-xdist workers with ``--dist loadfile``) keep each module on one
# worker: module fixtures (a daemon, a system user) are set up once, and tests that run in order on one device
# (tests/ota/test_ota_release_apply.py) keep their order. The modules that use the session's tarballs share one
# worker: a second would build the pair again (about 50 s), and the packaging tests bind-mount the machine's one
# /opt/edged (a second mount at the same time would skip).
TARBALL_MODULES = frozenset({"tests/ota/test_ota_release_apply.py", "tests/packaging/test_packaging_tarball.py",
                             "tests/packaging/test_packaging_relocation.py"})
TARBALL_GROUP = "tarballs"


def _work_unit(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return TARBALL_GROUP if module in TARBALL_MODULES else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """--dist loadfile, with the tarball modules as one unit (xdist's loadgroup marks do nothing under pytest 9:
    they rename ``_nodeid``, which pytest 9 no longer reads)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    return ModuleScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    strays = {item.nodeid.split("::", 1)[0] for item in items if "tarballs" in getattr(item, "fixturenames", ())}
    if strays - TARBALL_MODULES:
        raise pytest.UsageError(f"tests/conftest.py: add {sorted(strays - TARBALL_MODULES)} to TARBALL_MODULES "
                                "(they use the session's tarballs)")
    if not hasattr(config, "workerinput"):  # not an xdist worker: the collection order stays
        return
    # The tarball unit (about five minutes), then the other units with a slow test, first: xdist hands out units
    # in collection order under --no-loadscope-reorder, and a long unit handed out last would run alone at the
    # end while the other worker idles. Within a unit the order stays (the sort is stable).
    slow = {_work_unit(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (_work_unit(item.nodeid) != TARBALL_GROUP, _work_unit(item.nodeid) not in slow))


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


@pytest.fixture(scope="session")
def installed(tarballs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root of one install of the first tarball with --root, shared by the tests that only read an install or
    run it (a test that changes an install makes its own). The root's name holds sed's delimiter, its "whole
    match" and a back-reference, so every reader also checks that install.sh's path rewriting survives them."""
    from tarball_harness import sh, unpack

    work = tmp_path_factory.mktemp("installed")
    root = work / "image|a&b\\1"
    sh(unpack(tarballs[0], work / "pkg") / "install.sh", "--root", str(root))
    return root
