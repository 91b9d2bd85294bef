"""Regression guard: 50 load/unload cycles of a ~50 MB ONNX model do not grow RSS, under each allocator.

Runs scripts/bench_memory.py's worker in a subprocess: it calls ensure_allocator (re-exec included), then
loads an InferenceSession from a path (arena on, shrinkage per run), runs batch 1 and 16, drops the
session and calls release_memory after each unload.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import bench_memory  # noqa: E402

MIB = 1024 * 1024
SETTLE = 3  # cycles before RSS is taken as the baseline


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "chain.onnx"
    weights = bench_memory.build_model(path)
    assert 48e6 < weights < 53e6
    return path


@pytest.mark.slow
@pytest.mark.parametrize("allocator", ["system", "jemalloc", "tcmalloc"])
def test_fifty_load_unload_cycles_do_not_grow_rss(model: Path, allocator: str) -> None:
    result = bench_memory.run_worker(model, allocator, cycles=50, arena="on", threads=2)
    assert result["allocator"] == allocator
    rss = [cycle["rss"] for cycle in result["cycles"]]
    assert len(rss) == 50
    growth = max(rss[SETTLE:]) - rss[SETTLE - 1]
    assert growth < 10 * MIB, f"RSS after each cycle (MiB): {[round(r / MIB) for r in rss]}"
    # The model really was loaded each time: about its weights in RSS once freed pages are returned.
    footprints = sorted(cycle["footprint_released"] for cycle in result["cycles"])
    assert 40 * MIB < footprints[len(footprints) // 2] < 80 * MIB
