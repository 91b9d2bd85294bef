"""release_memory gives freed heap back under each real allocator (LD_PRELOAD in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edged.memory import find_library, release_memory

REPO = Path(__file__).resolve().parents[2]

# Many blocks above pymalloc's 512-byte limit (so malloc serves them) and below glibc's mmap threshold
# (which it would unmap at free without help); one block allocated last pins the top of the heap.
CHURN = """
import json
from edged.memory import active_allocator, release_memory
keep = []
blocks = [bytes(600 + i % 200) for i in range(100_000)]
keep.append(bytes(64))
del blocks
report = release_memory()
print(json.dumps({"allocator": active_allocator().name, "actions": report.actions,
                  "before": report.rss_before_bytes, "after": report.rss_after_bytes}))
"""


@pytest.mark.parametrize("allocator", ["system", "jemalloc", "tcmalloc"])
def test_release_returns_freed_small_blocks_to_the_kernel(allocator: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    if allocator != "system":
        library = find_library(allocator)
        assert library is not None
        env["LD_PRELOAD"] = str(library)
    done = subprocess.run([sys.executable, "-c", CHURN], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    result = json.loads(done.stdout)
    assert result["allocator"] == allocator
    released = result["before"] - result["after"]
    assert released > 40 * 1024 * 1024, result


def test_release_in_this_process_reports_rss_and_the_calls_made() -> None:
    report = release_memory()
    assert report.rss_before_bytes > 0 and report.rss_after_bytes > 0
    assert "malloc_trim(0)" in report.actions
    assert report.released_bytes == report.rss_before_bytes - report.rss_after_bytes
