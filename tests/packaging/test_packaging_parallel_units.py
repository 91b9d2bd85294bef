"""`./dev test` runs the suite on two pytest-xdist workers with the work units of tests/conftest.py: every test
of a module runs on one worker (module fixtures are set up once, ordered tests keep their order)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Two small modules with several tests each: a per-test distribution would split at least one of them.
MODULES = ("tests/clock/test_clock.py", "tests/config/test_config_version.py")


def dev_test_flags() -> list[str]:
    (flags,) = re.findall(r'-m pytest -q --durations=25 (.*) "\$@"$', (ROOT / "dev").read_text(), re.MULTILINE)
    return shlex.split(flags)


def test_dev_test_runs_two_workers_and_keeps_each_module_on_one() -> None:
    flags = dev_test_flags()
    assert flags[:2] == ["-n", "2"], flags
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", *flags, *MODULES],
                            cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, module in re.findall(r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+?)::", result.stdout, re.MULTILINE):
        workers.setdefault(module, set()).add(worker)
    assert set(workers) == set(MODULES), result.stdout[-3000:]
    assert all(len(ran_on) == 1 for ran_on in workers.values()), workers
