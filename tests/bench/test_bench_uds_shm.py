"""``edged bench --transport uds --shm`` against a spawned daemon: every request answered through system shared
memory, and no region left behind."""

from __future__ import annotations

import json
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
    assert set(Path("/dev/shm").iterdir()) == before
