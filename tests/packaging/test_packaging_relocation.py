"""An install staged with --root (the way images are built) works at its real path: no staged path is left in
the tree, the release links survive an absolute ``current``, and the units travel with the release."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from tarball_harness import mounted_at_opt, reseal, run_installed, sh, unpack

pytestmark = pytest.mark.slow


def files_naming(tree: Path, text: str) -> list[str]:
    needle = text.encode()
    return [str(p) for p in tree.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


def test_staged_image_runs_at_its_real_path_and_names_no_staging_path(installed: Path) -> None:
    root = installed  # its name holds sed's delimiter, its "whole match" and a back-reference
    assert "|" in root.name and "&" in root.name and "\\1" in root.name
    assert files_naming(root / "opt/edged", str(root)) == []
    assert files_naming(root / "opt/edged", "/releases/.partial-0.1.0") == []
    shebang = (root / "opt/edged/current/bin/edged").read_text().splitlines()[0]
    assert shebang == "#!/opt/edged/releases/0.1.0/bin/python"
    with mounted_at_opt(root) as opt:
        edged = opt / "current/bin/edged"
        assert run_installed(edged, "--version") == b"edged 0.1.0\n"
        probe = run_installed(opt / "current/bin/python", "-c",
                              "import os, sys, edged; print(os.path.realpath(sys.prefix)); print(edged.__file__)")
    prefix, module = probe.decode().splitlines()
    assert prefix == "/opt/edged/releases/0.1.0"
    assert module.startswith("/opt/edged/current/lib/")


def test_an_absolute_current_link_keeps_its_release_through_an_upgrade(tarballs: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    first, second = (unpack(t, tmp_path / name) for t, name in zip(tarballs, ("v1", "v2"), strict=True))
    root = tmp_path / "root"
    opt = root / "opt/edged"
    sh(first / "install.sh", "--root", str(root))
    (opt / "current").unlink()
    (opt / "current").symlink_to("/opt/edged/releases/0.1.0")  # as an operator or an image tool may write it
    sh(second / "install.sh", "--root", str(root))
    assert os.readlink(opt / "current") == "releases/0.1.0.post1"
    assert os.readlink(opt / "previous") == "releases/0.1.0"
    assert (opt / "releases/0.1.0/.edged-release").is_file(), "the previous release was pruned"
    sh(second / "install.sh", "--root", str(root), "--rollback")
    assert os.readlink(opt / "current") == "releases/0.1.0"


def test_rollback_reinstalls_the_units_of_the_release_it_returns_to(tarballs: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    first, second = (unpack(t, tmp_path / name) for t, name in zip(tarballs, ("v1", "v2"), strict=True))
    unit = second / "systemd/edged.service"
    unit.write_text(unit.read_text().replace("RestartSec=10s", "RestartSec=7s"))
    reseal(second)
    root = tmp_path / "root"
    installed = root / "etc/systemd/system/edged.service"
    sh(first / "install.sh", "--root", str(root))
    assert "RestartSec=10s" in installed.read_text().splitlines()
    sh(second / "install.sh", "--root", str(root))
    assert "RestartSec=7s" in installed.read_text().splitlines()
    sh(second / "install.sh", "--root", str(root), "--rollback")
    assert installed.read_text() == (first / "systemd/edged.service").read_text()
    assert not list(installed.parent.glob("*.new"))


def test_every_documentation_path_of_the_installed_units_exists(installed: Path) -> None:
    root = installed
    documented = []
    for name in ("edged.service", "edged.socket", "edged-grpc.socket", "edged-update.service", "edged-update.path"):
        text = (root / "etc/systemd/system" / name).read_text()
        documented += re.findall(r"^Documentation=file:(\S+)$", text, re.MULTILINE)
    assert documented, "the units name no Documentation= file"
    for path in documented:
        assert (root / path.lstrip("/")).is_file(), path


def test_a_staged_image_enables_its_units_as_systemctl_enable_does(installed: Path) -> None:
    system = installed / "etc/systemd/system"
    expected = {"sockets.target.wants/edged.socket", "multi-user.target.wants/edged.service",
                "paths.target.wants/edged-update.path", "multi-user.target.wants/edged-update.service"}
    for link in expected:
        unit = link.rsplit("/", 1)[1]
        assert os.readlink(system / link) == f"/etc/systemd/system/{unit}", link
        assert (system / unit).is_file()
    assert not (system / "sockets.target.wants/edged-grpc.socket").exists()  # gRPC stays off until configured
