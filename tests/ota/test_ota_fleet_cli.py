"""`edged fleet` from the command line: a wave is promoted only with an honest failure count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.edged_daemon import daemon_environment
from tests.ota.conftest import model_folder, vectors_for


def _edged(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=120,
                          env=daemon_environment(), check=False)


def test_promote_needs_a_failure_count_and_stops_when_failures_exceed_the_limit(tmp_path: Path) -> None:
    repo = str(tmp_path / "fleet")
    assert _edged("fleet", "init", repo, "--threshold", "2").returncode == 0
    assert (tmp_path / "fleet.keys" / "root-2.pem").exists()
    assert not list((tmp_path / "fleet").rglob("*.pem"))  # REPO is served as it is: no key inside it
    source = model_folder(tmp_path / "src", 2, seed=2)
    (source / "2" / "test_vectors.json").write_bytes(vectors_for(2))
    added = _edged("fleet", "add-model", repo, str(source), "--version", "2", "--percent", "10",
                   "--compat", "min_edged_version=0.1")
    assert added.returncode == 0, added.stderr
    target = "models/mlp/2.tar"
    blind = _edged("fleet", "promote", repo, target, "--percent", "50")
    assert blind.returncode == 1 and "no failure count given" in blind.stderr
    failing = _edged("fleet", "promote", repo, target, "--percent", "50", "--failures", "3", "--max-failures", "1")
    assert failing.returncode == 1 and "3 devices failed it, more than --max-failures 1" in failing.stderr
    assert json.loads(_edged("fleet", "targets", repo).stdout)[target]["percent"] == 10
    ok = _edged("fleet", "promote", repo, target, "--percent", "50", "--failures", "0")
    assert ok.returncode == 0, ok.stderr
    listed = json.loads(_edged("fleet", "targets", repo).stdout)[target]
    assert listed["percent"] == 50 and listed["compat"] == {"min_edged_version": "0.1"}
    bad = _edged("fleet", "add-model", repo, str(source), "--version", "2", "--compat", "gpu=orin")
    assert bad.returncode == 1 and "--compat gpu: unknown key" in bad.stderr
