"""perf_analyzer 2.51 with ``-i grpc`` against the daemon's gRPC port, plain, with ``--shared-memory system``
(the regions it creates are registered with the configured metadata key) and ``--streaming`` (ModelStreamInfer,
as DeepStream's nvinferserver calls it). The binary comes from
scripts/get_perf_analyzer.sh (or $EDGED_PERF_ANALYZER); without it these tests skip."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest
from grpcapi_daemon import SHM_KEY, GrpcDaemon

ROOT = Path(__file__).resolve().parents[2]
PERF_ANALYZER = Path(os.environ.get("EDGED_PERF_ANALYZER", ROOT / ".cache" / "perf_analyzer" / "perf_analyzer"))

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not PERF_ANALYZER.exists(),
    reason=f"perf_analyzer not found at {PERF_ANALYZER}; run scripts/get_perf_analyzer.sh to fetch it")]


@pytest.mark.parametrize(("shared_memory", "streaming"), [("none", False), ("system", False), ("none", True),
                                                         ("system", True)])
def test_perf_analyzer_over_grpc(grpc_daemon: GrpcDaemon, tmp_path: Path, shared_memory: str,
                                 streaming: bool) -> None:
    csv_path = tmp_path / "pa.csv"
    done = subprocess.run(
        [str(PERF_ANALYZER), "-m", "tiny_mlp", "-i", "grpc", "-u", grpc_daemon.tcp, "--concurrency-range", "2",
         "--measurement-interval", "1000", "--stability-percentage", "1000", "--max-trials", "3",
         "--shared-memory", shared_memory, "-H", f"{SHM_KEY[0]}:{SHM_KEY[1]}", "-f", str(csv_path),
         *(["--streaming"] if streaming else [])],
        check=False, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Inference count" in done.stdout  # it read the server-side statistics over gRPC
    row = next(csv.DictReader(csv_path.open()))
    assert float(row["Inferences/Second"]) > 100, row
    assert 0 < int(row["p50 latency"]) < 1_000_000, row
