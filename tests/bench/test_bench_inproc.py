"""``edged bench --transport inproc`` end to end with each kind of caller, on the bundled tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edged.cli.main import main


@pytest.mark.timeout(120)
@pytest.mark.parametrize("client", ["callbacks", "threads", "asyncio"])
def test_inproc_bench_measures_batched_and_unbatched_engines_side_by_side(
        client: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    scenarios = tmp_path / "scenarios.toml"
    scenarios.write_text(f'[[scenario]]\ntransport = "inproc"\nmodel = "tiny_mlp"\nconcurrency = [1, 4]\n'
                         f'batching = "both"\nclient = "{client}"\nduration_s = 0.3\nwarmup_s = 0.1\n')
    code = main(["bench", "--scenarios", str(scenarios), "--json", str(tmp_path / "results.json")])

    assert code == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "results.json").read_text())
    engine = [row for row in rows if row["transport"] == f"inproc-{client}"]
    assert sorted((row["batching"], row["concurrency"]) for row in engine) == [
        ("off", 1), ("off", 4), ("on", 1), ("on", 4)]
    for row in engine:
        assert row["requests"] > 0 and row["errors"] == 0 and row["throughput"] > 0
        assert 0 < row["p50_us"] <= row["p99_us"] <= row["p999_us"]
        assert row["mean_batch"] >= 1.0
    unbatched = [row for row in engine if row["batching"] == "off"]
    assert all(row["mean_batch"] == 1.0 for row in unbatched), "without dynamic batching every execution is one"
    raw = [row for row in rows if row["transport"] == "raw-onnxruntime"]
    assert len(raw) == 1 and raw[0]["requests"] > 0
    assert f"dynamic batching, tiny_mlp at concurrency 4 ({client} callers):" in out
    assert "the unbatched engine" in out


def test_callback_callers_at_concurrency_four_share_batches(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    """Four requests kept in flight by completion callbacks queue up while the previous batch runs."""
    code = main(["bench", "--transport", "inproc", "--concurrency", "4", "--batching", "on", "--duration", "0.3",
                 "--no-raw", "--json", str(tmp_path / "results.json")])

    assert code == 0
    (row,) = json.loads((tmp_path / "results.json").read_text())
    assert row["transport"] == "inproc-callbacks" and row["batching"] == "on"
    assert row["mean_batch"] > 2.0, f"batches of {row['mean_batch']:.2f} on average"


@pytest.mark.parametrize("target", ["missing-dir/results.json", "a-directory"])
def test_a_json_file_that_cannot_be_written_is_refused_before_the_run(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str) -> None:
    """--json into a folder that does not exist ran the whole benchmark, then ended in a FileNotFoundError
    traceback, the results lost with it."""
    (tmp_path / "a-directory").mkdir()
    output = tmp_path / target
    code = main(["bench", "--duration", "0.2", "--no-raw", "--json", str(output)])
    captured = capsys.readouterr()
    assert code == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("edged bench: error: --json ") and str(output) in captured.err
    assert captured.out == ""  # refused before measuring anything
