"""Readers for the /proc files this package uses; the proc root is a parameter so tests use recorded files.

Every reader returns None (or an empty mapping) for a file or field the running kernel does not provide:
/proc/pressure needs Linux 4.20 with PSI enabled, NvMapMemUsed exists only on Jetson (L4T) kernels.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE")


def read_rss_bytes(proc_root: Path = PROC, pid: str = "self") -> int:
    """Resident set size from ``statm`` (its second field, in pages): cheap enough for every load."""
    fields = (proc_root / pid / "statm").read_text(encoding="ascii").split()
    return int(fields[1]) * page_size()


def read_hwm_bytes(proc_root: Path = PROC, pid: str = "self") -> int | None:
    """The process's peak resident set size (``VmHWM`` in ``status``) since start or the last reset."""
    try:
        text = (proc_root / pid / "status").read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def reset_hwm(proc_root: Path = PROC, pid: str = "self") -> bool:
    """Set VmHWM back to the current RSS (writing "5" to ``clear_refs``, Linux 4.0+); False where refused."""
    try:
        (proc_root / pid / "clear_refs").write_text("5", encoding="ascii")
    except OSError:
        return False
    return True


def read_meminfo(proc_root: Path = PROC) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per field (``kB`` values are scaled; unit-less counters are kept as is)."""
    try:
        text = (proc_root / "meminfo").read_text(encoding="ascii")
    except FileNotFoundError:
        return {}
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
        values[name.strip()] = int(parts[0]) * scale
    return values


def read_psi_some_avg10(proc_root: Path = PROC) -> float | None:
    """``some avg10=`` from ``pressure/memory``: the share of the last 10 s some task stalled on memory."""
    try:
        text = (proc_root / "pressure" / "memory").read_text(encoding="ascii")
    except (FileNotFoundError, OSError):
        # Absent without CONFIG_PSI; EOPNOTSUPP when the kernel was booted with psi=0.
        return None
    for line in text.splitlines():
        kind, *pairs = line.split()
        if kind != "some":
            continue
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key == "avg10":
                return float(value)
    return None


def read_mapped_paths(proc_root: Path = PROC, pid: str = "self") -> list[tuple[int, int, str]]:
    """File-backed mappings of a process as (start, end, path)."""
    mappings: list[tuple[int, int, str]] = []
    text = (proc_root / pid / "maps").read_text(encoding="utf-8", errors="replace")
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        start, _, end = parts[0].partition("-")
        mappings.append((int(start, 16), int(end, 16), parts[5]))
    return mappings
