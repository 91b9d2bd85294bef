"""``edged bench --transport uds --shm`` against a spawned daemon: every request answered through system shared
memory, and no region left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edged.cli.main import main


@pytest.mark.timeout(180)
def test_uds_bench_over_shared_memory_answers_every_request_and_cleans_up(tmp_path: Path) -> None:
    before = set(Path("/dev/shm").iterdir())
    code = main(["bench", "--transport", "uds", "--spawn", "--shm", "--concurrency", "1,2", "--duration", "0.5",
                 "--json", str(tmp_path / "results.json")])
    assert code == 0
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [(row["transport"], row["concurrency"]) for row in rows] == [("uds+shm", 1), ("uds+shm", 2)]
    for row in rows:
        assert row["requests"] > 0 and row["errors"] == 0
    # A parallel run's other worker makes and removes regions of its own meanwhile: the bench's regions carry the
    # pid of the process that runs it, this one.
    assert [p.name for p in set(Path("/dev/shm").iterdir()) - before if str(os.getpid()) in p.name] == []
