"""`./dev serve` on a machine as it comes: it installs python3-venv when `python3 -m venv` cannot work, and it
installs every extra that the README's commands need. apt-get and the system Python are the edges replaced."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (JetPack 6)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_dev_serve_installs_python3_venv_when_venv_cannot_work(tmp_path: Path) -> None:
    shutil.copy2(ROOT / "dev", tmp_path / "dev")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    _fake(bin_dir, "apt-get", f'echo "$@" >> "{log}"\n')
    # Debian's python3 without python3-venv: ensurepip is missing, so `python3 -m venv` fails
    _fake(bin_dir, "python3", 'case "$*" in *ensurepip*) exit 1 ;; *"-m venv"*) exit 3 ;; esac\nexit 0\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": "python3"}
    result = subprocess.run([str(tmp_path / "dev"), "serve"], capture_output=True, text=True, env=env,
                            timeout=60, check=False)
    assert result.returncode == 3, result.stderr  # it went on to create the venv after apt-get
    installs = [line for line in log.read_text().splitlines() if line.startswith("install")]
    assert installs and "python3-venv" in installs[0].split(), log.read_text()


def test_dev_serve_installs_every_extra_the_readme_commands_need() -> None:
    script = (ROOT / "dev").read_text()
    (extras,) = re.findall(r'^SERVE_EXTRAS="([^"]+)"$', script, re.MULTILINE)
    chosen = set(extras.split(","))
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert chosen <= set(optional), chosen - set(optional)
    installed = " ".join(requirement for extra in chosen for requirement in optional[extra])
    readme = (ROOT / "README.md").read_text()
    # the command table's optional imports: edged top needs rich, edged telemetry plot needs matplotlib
    for command, requirement in (("edged top", "rich"), ("telemetry parse\\|summary\\|query\\|export\\|plot",
                                                           "matplotlib"), ("edged infer", "pillow"),
                                 ("edged fleet init", "tuf"), ("edged ota check", "tuf"),
                                 ("POST /v1/chat/completions", "onnxruntime-genai"), ("--grpc-port", "protobuf")):
        assert command in readme, command
        assert requirement in installed, f"{command} needs {requirement}, which ./dev serve does not install"
