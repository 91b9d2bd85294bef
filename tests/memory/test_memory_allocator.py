"""The allocator re-exec with Debian's real jemalloc and tcmalloc, observed from outside the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edged.config import MemoryConfig
from edged.memory import REEXEC_MARKER, find_library

REPO = Path(__file__).resolve().parents[2]

# Prints one START line per process image, so the number of re-execs is visible; after ensure_allocator it
# reports its state and waits for a line on stdin so the test can read /proc/<pid>/maps while it is alive.
ENTRY = """
import dataclasses, json, os, sys
print("START", os.getpid(), os.environ.get("EDGED_ALLOCATOR_REEXEC", ""), flush=True)
from edged.config import MemoryConfig
from edged.memory import ensure_allocator
config = MemoryConfig(**json.loads(sys.argv[1]))
state = ensure_allocator(config, sys.orig_argv)
print("STATE", json.dumps(dataclasses.asdict(state)), flush=True)
sys.stdin.readline()
"""


def run_entry(tmp_path: Path, config: dict[str, object], env: dict[str, str] | None = None,
              ) -> tuple[list[str], dict[str, Any], str, str]:
    script = tmp_path / "entry.py"
    script.write_text(ENTRY, encoding="utf-8")
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF", REEXEC_MARKER)}
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(config)], cwd=REPO,
                            env={**base, **(env or {})}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    starts = []
    for line in proc.stdout:
        if line.startswith("START"):
            starts.append(line.strip())
        elif line.startswith("STATE"):
            state = json.loads(line.split(" ", 1)[1])
            break
    else:
        raise AssertionError(f"entry script ended without a state: {proc.communicate()[1]}")
    maps = Path(f"/proc/{proc.pid}/maps").read_text(encoding="utf-8")
    _, stderr = proc.communicate("done\n", timeout=30)
    assert proc.returncode == 0, stderr
    return starts, state, maps, stderr


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc"])
def test_reexec_maps_the_library_exactly_once(tmp_path: Path, allocator: str) -> None:
    library = find_library(allocator)
    assert library is not None, f"Debian's {allocator} library is expected on the build machines"
    starts, state, maps, _ = run_entry(tmp_path, {"allocator": allocator})
    assert len(starts) == 2  # the original image and exactly one re-exec
    first, second = (s.split() for s in starts)
    assert first[1] == second[1]  # execve keeps the pid
    assert second[2:] == [allocator]  # the marker the second image saw
    assert str(library) in maps
    assert state["name"] == allocator
    assert state["reexecuted"] is True
    assert state["settings"]["LD_PRELOAD"] == str(library)


def test_jemalloc_reexec_applies_the_configured_decay(tmp_path: Path) -> None:
    _, state, _, _ = run_entry(tmp_path, {"allocator": "jemalloc"})
    assert state["settings"]["MALLOC_CONF"] == MemoryConfig().jemalloc_conf


def test_malloc_conf_from_the_environment_wins(tmp_path: Path) -> None:
    env = {"MALLOC_CONF": "dirty_decay_ms:5000"}
    _, state, _, _ = run_entry(tmp_path, {"allocator": "jemalloc"}, env=env)
    assert state["settings"]["MALLOC_CONF"] == "dirty_decay_ms:5000"


def test_tcmalloc_reexec_sets_the_release_rate(tmp_path: Path) -> None:
    _, state, _, _ = run_entry(tmp_path, {"allocator": "tcmalloc", "tcmalloc_release_rate": 7.5})
    assert state["settings"]["TCMALLOC_RELEASE_RATE"] == "7.5"


def test_missing_library_warns_with_the_package_and_does_not_reexec(tmp_path: Path) -> None:
    missing = str(tmp_path / "libjemalloc.so.2")
    starts, state, maps, stderr = run_entry(tmp_path, {"allocator": "jemalloc", "allocator_library": missing})
    assert len(starts) == 1
    assert state["name"] == "system"
    assert "libjemalloc2" in state["warning"] and missing in state["warning"]
    assert "libjemalloc2" in stderr  # the logging module's last-resort handler
    assert "libjemalloc" not in maps


def test_preload_that_does_not_take_warns_once_and_does_not_loop(tmp_path: Path) -> None:
    # A real shared library that is not an allocator: it gets mapped, but malloc still comes from glibc.
    not_an_allocator = find_library_named("libz.so.1")
    starts, state, maps, _ = run_entry(tmp_path, {"allocator": "jemalloc",
                                                  "allocator_library": str(not_an_allocator)})
    assert len(starts) == 2
    assert state["name"] == "system"
    assert "still comes from" in state["warning"]
    assert str(not_an_allocator) in maps


def test_system_allocator_never_reexecs(tmp_path: Path) -> None:
    starts, state, _, _ = run_entry(tmp_path, {"allocator": "system"})
    assert len(starts) == 1
    assert state["name"] == "system"
    assert state["library"] is not None and "libc" in state["library"]


def test_an_allocator_preloaded_by_the_operator_is_reported_as_is(tmp_path: Path) -> None:
    library = find_library("jemalloc")
    assert library is not None
    starts, state, _, _ = run_entry(tmp_path, {"allocator": "system"}, env={"LD_PRELOAD": str(library)})
    assert len(starts) == 1
    assert state["name"] == "jemalloc"


def test_find_library_uses_the_multiarch_directory_of_this_machine() -> None:
    library = find_library("jemalloc")
    assert library is not None
    triplet = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}[os.uname().machine]
    assert library.parent.name == triplet


def find_library_named(name: str) -> Path:
    triplet = f"{os.uname().machine}-linux-gnu"
    for directory in (Path("/usr/lib") / triplet, Path("/lib") / triplet):
        if (directory / name).is_file():
            return directory / name
    raise AssertionError(f"{name} not found")
