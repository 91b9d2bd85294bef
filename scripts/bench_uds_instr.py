"""Instructions per request of the socket API's hot loop, counted by callgrind for each of several code trees.

Timings on a shared machine drift with its load; instruction counts do not. Each tree runs
``bench_uds_hot.py --counted N`` (from this script's folder, with that tree on PYTHONPATH) under
``valgrind --tool=callgrind``, which counts only inside the one call that runs the N requests. What the count
leaves out is what the hot loop leaves out: the kernel's read, write and wake-up, and the cost of caches and
predictors gone cold between requests.

    .venv/bin/python scripts/bench_uds_instr.py TREE [TREE ...] [--requests 200]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "bench_uds_hot.py"


def count(tree: Path, requests: int) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=functools_reduce",
             f"--callgrind-out-file={scratch}/callgrind.out", sys.executable, str(SCRIPT), "--counted",
             str(requests)],
            cwd=tree, env={**os.environ, "PYTHONPATH": str(tree.resolve())}, capture_output=True, text=True,
            check=False)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None or f"counted {requests}" not in out.stdout:
        raise SystemExit(f"{tree}: callgrind run failed:\n{out.stdout}\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    for tree in args.trees:
        total = count(tree, args.requests)
        print(f"{tree}: {total / args.requests:,.0f} instructions per request ({total:,} for {args.requests})")


if __name__ == "__main__":
    main()
