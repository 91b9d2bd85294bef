"""Allocator hooks: which malloc this process runs on, and a one-time re-exec onto jemalloc or tcmalloc.

A shared allocator can only replace glibc malloc if it is loaded before everything else, so the daemon
re-executes itself once with LD_PRELOAD. Invariants: at most one re-exec per start (a marker variable in the
environment); a missing library or a preload that did not take is a warning, never a crash or a loop;
settings the environment already carries (a systemd drop-in's MALLOC_CONF) win over the config's.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from edged.config import MemoryConfig
from edged.memory._procfs import PROC, read_mapped_paths

log = logging.getLogger(__name__)

AllocatorName = Literal["system", "jemalloc", "tcmalloc", "other"]

REEXEC_MARKER = "EDGED_ALLOCATOR_REEXEC"

_LIBRARY_NAMES: Mapping[str, tuple[str, ...]] = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"),
}
_PACKAGES: Mapping[str, str] = {
    "jemalloc": "libjemalloc2",
    "tcmalloc": "libtcmalloc-minimal4 (libtcmalloc-minimal4t64 on Ubuntu 24.04 and later)",
}
_MACHINE_TRIPLETS: Mapping[str, str] = {
    "x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu",
}
_SETTING_VARIABLES = ("LD_PRELOAD", "MALLOC_CONF", "TCMALLOC_RELEASE_RATE")


@dataclass(frozen=True)
class AllocatorState:
    """The allocator that serves this process's malloc, for server metadata, /metrics and doctor."""

    name: AllocatorName
    library: str | None  # the shared object that provides malloc (libc for "system")
    settings: dict[str, str] = field(default_factory=dict)  # LD_PRELOAD, MALLOC_CONF, ... as applied
    requested: str = "system"
    reexecuted: bool = False
    warning: str | None = None


def library_dirs() -> list[Path]:
    """Debian/Ubuntu multiarch directories for the running architecture, then the generic ones."""
    triplet = sysconfig.get_config_var("MULTIARCH") or _MACHINE_TRIPLETS.get(platform.machine(), "")
    prefixes = ("/usr/lib", "/lib", "/usr/local/lib") if triplet else ()
    generic = (Path("/usr/local/lib"), Path("/usr/lib"), Path("/usr/lib64"))
    return [*(Path(p) / triplet for p in prefixes), *generic]


def find_library(name: str, explicit: str = "") -> Path | None:
    """The shared library for allocator ``name``: ``explicit`` if given (and present), else a search."""
    if explicit:
        path = Path(explicit)
        return path if path.is_file() else None
    for directory in library_dirs():
        for filename in _LIBRARY_NAMES.get(name, ()):
            candidate = directory / filename
            if candidate.is_file():
                return candidate
    return None


def malloc_provider(proc_root: Path = PROC) -> str | None:
    """Path of the mapped object whose code ``malloc`` resolves to in this process (None if not found)."""
    address = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value or 0
    for start, end, path in read_mapped_paths(proc_root):
        if start <= address < end:
            return path
    return None


def classify(library: str | None) -> AllocatorName:
    base = os.path.basename(library or "")
    if base.startswith("libjemalloc"):
        return "jemalloc"
    if base.startswith("libtcmalloc"):
        return "tcmalloc"
    if base.startswith(("libc.so", "libc-")):
        return "system"
    return "other"


def active_allocator() -> AllocatorState:
    """What serves malloc now, with the environment settings that configure it."""
    library = malloc_provider()
    name = classify(library)
    settings = {k: os.environ[k] for k in _SETTING_VARIABLES if k in os.environ}
    return AllocatorState(name=name, library=library, settings=settings,
                          reexecuted=REEXEC_MARKER in os.environ)


def reexec_environment(config: MemoryConfig, library: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for the re-exec: our library first in LD_PRELOAD, tuning unless already set, marker."""
    env = dict(environ)
    preload = environ.get("LD_PRELOAD", "").strip()
    env["LD_PRELOAD"] = f"{library} {preload}" if preload else str(library)
    if config.allocator == "jemalloc":
        env.setdefault("MALLOC_CONF", config.jemalloc_conf)
    elif config.allocator == "tcmalloc":
        env.setdefault("TCMALLOC_RELEASE_RATE", f"{config.tcmalloc_release_rate:g}")
    env[REEXEC_MARKER] = config.allocator
    return env


def ensure_allocator(config: MemoryConfig, argv: Sequence[str]) -> AllocatorState:
    """Make ``config.allocator`` serve malloc, re-executing the process once if needed (then never returns).

    ``argv`` is the whole command line the interpreter was started with (``sys.orig_argv``); the re-exec runs
    ``sys.executable`` with ``argv[1:]``, so ``python -m edged serve ...`` and the ``edged`` script both work.
    """
    current = replace(active_allocator(), requested=config.allocator)
    if config.allocator in ("system", current.name):
        return current
    library = find_library(config.allocator, config.allocator_library)
    if library is None:
        return _warn(current, _missing_message(config))
    if current.reexecuted:
        return _warn(current, f"memory.allocator = {config.allocator!r}: re-executed with LD_PRELOAD="
                              f"{os.environ.get('LD_PRELOAD', '')!r} but malloc still comes from "
                              f"{current.library}; continuing with {current.name}")
    env = reexec_environment(config, library, os.environ)
    log.info("re-executing with LD_PRELOAD=%s for memory.allocator = %s", env["LD_PRELOAD"], config.allocator)
    _flush_output()
    try:
        os.execve(sys.executable, [sys.executable, *argv[1:]], env)
    except OSError as e:
        return _warn(current, f"memory.allocator = {config.allocator!r}: cannot re-execute "
                              f"{sys.executable}: {e.strerror}; continuing with {current.name}")
    raise RuntimeError("os.execve returned")  # pragma: no cover - execve either replaces us or raises


def _missing_message(config: MemoryConfig) -> str:
    if config.allocator_library:
        where = f"memory.allocator_library = {config.allocator_library!r} does not exist"
    else:
        names = " or ".join(_LIBRARY_NAMES[config.allocator])
        where = f"found no {names} in {', '.join(str(d) for d in library_dirs())}"
    return (f"memory.allocator = {config.allocator!r}: {where}; install the Debian/Ubuntu package "
            f"{_PACKAGES[config.allocator]}; continuing with the system allocator")


def _warn(state: AllocatorState, message: str) -> AllocatorState:
    log.warning("%s", message)
    return replace(state, warning=message)


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    for handler in logging.getLogger().handlers:
        handler.flush()
