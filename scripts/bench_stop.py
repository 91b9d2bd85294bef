"""How long the daemon takes to stop with many models loaded, old stop path against new, side by side.

Each code tree (``--tree NAME=PATH``, e.g. a ``git archive`` of an older commit) serves the same repository:
``--models`` real ONNX MLPs (tests/modelgen.py) and the same number of test-backend models whose instances take
``--close-delay`` seconds to close (a runtime slow to free its engine). SIGTERM is sent once the daemon is
ready; the figure is the time until the process has exited. Usage:

    PYTHONPATH=. python scripts/bench_stop.py --tree old=/tmp/old --tree new=. --models 20 --close-delay 1
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

from integration.edged_daemon import config_with_fakes, start_daemon  # noqa: E402
from modelgen import add_custom_model, add_model, mlp_weights  # noqa: E402


def repository(where: Path, models: int, close_delay: float, slow: bool) -> Path:
    repo = where / "models"
    for index in range(models):
        add_model(repo, f"mlp{index}", None, {1: mlp_weights(seed=index)})
        if slow:
            add_custom_model(repo, f"slow{index}", "doubling",
                             extra=f'parameters {{ key: "close_delay_s" value: {{ string_value: "{close_delay}" }} }}')
    return repo


def stop_seconds(tree: Path, workdir: Path, repo: Path, stop_timeout: float) -> float:
    os.environ["PYTHONPATH"] = str(tree)
    os.chdir(workdir.parent)  # `python -m edged` puts the working directory first on sys.path
    config = config_with_fakes(f'repository = "{repo}"\nwarmup = false\n\n'
                               f"[server]\nshutdown_timeout_s = 1\nstop_timeout_s = {stop_timeout}\n")
    if not (tree / "edged/daemon/_stop.py").exists():  # the old tree has no stop_timeout_s
        config = config.replace(f"stop_timeout_s = {stop_timeout}\n", "")
    daemon = start_daemon(workdir, config=config)
    started = time.monotonic()
    daemon.process.send_signal(signal.SIGTERM)
    status = daemon.process.wait(600)
    elapsed = time.monotonic() - started
    if status != 0:
        raise SystemExit(f"{tree}: exit status {status}:\n{daemon.output()[-2000:]}")
    budgeted = "stopping within" in daemon.output()  # only the stop budget's log line says so
    if budgeted != (tree / "edged/daemon/_stop.py").exists():
        raise SystemExit(f"{tree}: the daemon did not run this tree's code")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of an edged source tree")
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--close-delay", type=float, default=1.0)
    parser.add_argument("--stop-timeout", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = [(name, Path(path).resolve()) for name, _, path in (t.partition("=") for t in args.tree)]
    with TemporaryDirectory(prefix="edged-bench-stop-") as scratch:
        for slow in (False, True):
            repo = repository(Path(scratch) / ("slow" if slow else "idle"), args.models, args.close_delay, slow)
            label = (f"{args.models} ONNX + {args.models} models closing in {args.close_delay} s" if slow
                     else f"{args.models} ONNX models")
            for name, tree in trees:
                runs = [stop_seconds(tree, Path(scratch) / f"{name}-{slow}-{r}", repo, args.stop_timeout)
                        for r in range(args.rounds)]
                print(f"{label:<45} {name:<6} stop s: " + " ".join(f"{t:.2f}" for t in runs), flush=True)


if __name__ == "__main__":
    main()
