"""A model folder whose name is not UTF-8 (bytes such as b'\\xff' that os.fsdecode turns into lone surrogates) is
skipped with one warning naming it escaped; /v2/edged/status, the repository index and `edged status` keep
answering, and the other models serve. Review: orjson refused the surrogates and every one of them failed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from integration.edged_daemon import config_with_fakes, daemon_environment, start_daemon

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_a_folder_named_in_bytes_that_are_not_utf8_is_skipped_and_breaks_no_route(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    shutil.copytree(MODELS / "tiny_mlp", repository / "tiny_mlp")
    shutil.copytree(os.fsencode(MODELS / "tiny_mlp"), os.path.join(os.fsencode(repository), b"cam\xff"))
    daemon = start_daemon(tmp_path / "run", config=config_with_fakes(f'repository = "{repository}"\n'))
    try:
        client = daemon.client()
        for _ in range(3):  # each lists the repository again
            status = client.status()
            index = client.repository_index()
        assert [entry["name"] for entry in status["models"]] == ["tiny_mlp"]
        assert [(entry["name"], entry["state"]) for entry in index] == [("tiny_mlp", "READY")]
        shown = subprocess.run([sys.executable, "-m", "edged", "status", "--socket", str(daemon.socket_path)],
                               capture_output=True, text=True, timeout=60, env=daemon_environment(), check=False)
        assert shown.returncode == 0 and "tiny_mlp" in shown.stdout, shown.stdout + shown.stderr
        warnings = [line for line in daemon.output().splitlines() if "is not UTF-8" in line]
        assert len(warnings) == 1, daemon.output()
        assert "skipping the folder b'cam\\xff': its name is not UTF-8" in warnings[0]
    finally:
        assert daemon.stop() == 0, daemon.output()
