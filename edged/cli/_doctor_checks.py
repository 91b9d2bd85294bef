"""The checks of ``edged doctor``: small functions, each returning frozen Checks with the fix to apply.

A check never raises for what it inspects: whatever it finds broken becomes a ``fail`` or ``warn`` with the
command or setting that repairs it. Heavy runtimes are imported here, lazily, only when the check runs.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edged.config import MemoryConfig
from edged.memory import PressureMonitor, active_allocator, budget_bytes, find_library, read_meminfo
from edged.platform import l4t_release, module_model

Status = Literal["ok", "warn", "fail", "info"]

MIB = 1 << 20
# Debian/Ubuntu packages that provide [memory] allocator (the library names are edged.memory's).
ALLOCATOR_PACKAGES = {"jemalloc": "libjemalloc2",
                      "tcmalloc": "libtcmalloc-minimal4 (libtcmalloc-minimal4t64 on Ubuntu 24.04 and later)"}
# A budget this full refuses (policy refuse) or evicts for (evict_lru) all but the smallest next load.
BUDGET_NEARLY_FULL = 0.9


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None


def check_platform(root: Path) -> list[Check]:
    model = module_model(root)
    present, release = l4t_release(root)
    checks = [Check("module", "info", model or "not a Jetson (no /proc/device-tree/model)")]
    if not present:
        checks.append(Check("L4T / JetPack", "info", "no /etc/nv_tegra_release: not a Jetson, GPU parts are off"))
    elif release is None:
        checks.append(Check("L4T / JetPack", "warn", "/etc/nv_tegra_release is not in the documented form",
                            "check the file; `dpkg -s nvidia-l4t-core` shows the L4T version"))
    else:
        label = f"JetPack {release.jetpack}" if release.jetpack else "JetPack unknown"
        checks.append(Check("L4T / JetPack", "ok", f"L4T {release.version} ({label})"))
    return checks


def is_jetson(root: Path) -> bool:
    return l4t_release(root)[0]


def _import(name: str) -> tuple[Any, str | None]:
    try:
        return importlib.import_module(name), None
    except ImportError as e:
        return None, str(e)
    except Exception as e:  # a broken binary module: report it, do not crash the doctor
        return None, f"{type(e).__name__}: {e}"


def check_tensorrt(jetson: bool) -> Check:
    module, error = _import("tensorrt")
    if module is not None:
        return Check("TensorRT", "ok", f"tensorrt {getattr(module, '__version__', '?')}")
    if jetson:
        return Check("TensorRT", "fail", f"cannot import tensorrt ({error})",
                     "sudo apt install python3-libnvinfer (part of nvidia-jetpack); edged's venv sees it "
                     "through --system-site-packages")
    return Check("TensorRT", "info", "not installed: TensorRT models are unavailable on this machine")


def check_onnxruntime(jetson: bool) -> Check:
    module, error = _import("onnxruntime")
    if module is None:
        return Check("ONNX Runtime", "info", f"not installed ({error}): ONNX models are unavailable",
                     "install edged with the 'onnx' extra")
    providers = list(module.get_available_providers())
    detail = f"onnxruntime {module.__version__}, providers: {', '.join(providers)}"
    if jetson and not {"CUDAExecutionProvider", "TensorrtExecutionProvider"} & set(providers):
        return Check("ONNX Runtime", "warn", detail + " (CPU only)",
                     "pip install onnxruntime-gpu from NVIDIA's Jetson AI Lab index for your JetPack "
                     "(jp6/cu126 for JetPack 6) into /opt/edged/current")
    return Check("ONNX Runtime", "ok", detail)


def check_torch(jetson: bool) -> Check:
    module, error = _import("torch")
    if module is None:
        return Check("PyTorch", "info", f"not installed ({error}): PyTorch models are unavailable")
    cuda = bool(module.cuda.is_available())
    detail = f"torch {module.__version__}, CUDA {'available' if cuda else 'not available'}"
    if jetson and not cuda:
        return Check("PyTorch", "warn", detail,
                     "install NVIDIA's torch wheel for your JetPack (a PyPI torch has no Jetson CUDA)")
    return Check("PyTorch", "ok", detail)


def check_allocator(memory: MemoryConfig) -> Check:
    """Whether the configured allocator's library exists; the doctor's own malloc only as a hint (the daemon
    preloads the library itself at start, the doctor never does)."""
    state = active_allocator()
    here = f"{state.name} ({state.library})" if state.library else state.name
    if memory.allocator == "system":
        return Check("allocator", "info", f"configured: system (glibc malloc); in this process: {here}")
    library = find_library(memory.allocator, memory.allocator_library)
    if library is not None:
        return Check("allocator", "ok", f"configured: {memory.allocator}, {library} exists (the daemon preloads "
                     f"it at start); in this process: {here}")
    if memory.allocator_library:
        where = f"[memory] allocator_library = {memory.allocator_library!r} does not exist"
    else:
        where = f"no {memory.allocator} library in the system library directories"
    package = ALLOCATOR_PACKAGES[memory.allocator]
    fix = f"sudo apt install {package}"
    if memory.allocator_library:
        fix += ", then point [memory] allocator_library at its .so (or remove the setting to search for it)"
    return Check("allocator", "warn", f"configured: {memory.allocator}, but {where}: the daemon falls back to "
                 "glibc malloc, which keeps freed model memory", fix)


def size(value: float) -> str:
    return f"{value / MIB:,.0f} MiB" if value >= 10 * MIB else f"{value / MIB:.1f} MiB"


def check_memory(memory: MemoryConfig, proc: Path) -> list[Check]:
    """The host's memory as the daemon's PressureMonitor judges it: MemTotal/MemAvailable (and NvMapMemUsed,
    the GPU's share of the same DRAM on a Jetson), PSI, and the budget those numbers give."""
    meminfo = read_meminfo(proc)
    state = PressureMonitor.from_config(memory, proc).check()
    total = meminfo.get("MemTotal")
    return [_check_meminfo(memory, meminfo, proc), _check_psi(memory, state.some_avg10, proc),
            check_budget(memory, total)]


def _check_meminfo(memory: MemoryConfig, meminfo: Mapping[str, int], proc: Path) -> Check:
    total, available = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    if total is None or available is None:
        return Check("memory", "info", f"no MemTotal/MemAvailable in {proc / 'meminfo'}: the daemon cannot "
                     "judge memory pressure from it")
    detail = f"MemTotal {size(total)}, MemAvailable {size(available)} ({available / total:.0%})"
    if "NvMapMemUsed" in meminfo:
        detail += f", NvMapMemUsed {size(meminfo['NvMapMemUsed'])} (GPU buffers, in the same DRAM)"
    floor = memory.pressure_min_available_mb * MIB
    if available < floor:
        return Check("memory", "warn", f"{detail}: MemAvailable is below the pressure threshold {size(floor)} "
                     "([memory] pressure_min_available_mb), so the daemon refuses new loads",
                     "MemAvailable below the pressure threshold: unload models (edged models unload NAME) or "
                     "lower [memory] budget_mb; stop other memory users")
    return Check("memory", "ok", detail)


def _check_psi(memory: MemoryConfig, avg10: float | None, proc: Path) -> Check:
    if avg10 is None:
        return Check("memory PSI", "info", f"no {proc / 'pressure/memory'} (a kernel without CONFIG_PSI, or "
                     "booted with psi=0): the daemon watches MemAvailable only")
    detail = f"some avg10 {avg10:.2f}% (tasks stalled on memory in the last 10 s)"
    ceiling = memory.pressure_some_avg10_max
    if avg10 > ceiling:
        return Check("memory PSI", "warn", f"{detail}: above [memory] pressure_some_avg10_max {ceiling:g}%, so "
                     "the daemon refuses new loads", "the system is thrashing: unload models or lower [memory] "
                     "budget_mb; stop other memory users")
    return Check("memory PSI", "ok", detail)


def check_budget(memory: MemoryConfig, total: int | None) -> Check:
    policy = {"refuse": "policy refuse: a load beyond it is refused",
              "evict_lru": "policy evict_lru: the least recently used idle model is unloaded to make room"}
    detail_policy = policy[memory.policy]
    if memory.budget_mb is None and memory.budget_percent is None:
        return Check("memory budget", "info", "none ([memory] budget_mb and budget_percent unset): models load "
                     "until memory runs out", "set [memory] budget_percent (e.g. 60) or budget_mb to keep memory "
                     "for the rest of the device")
    if memory.budget_mb is not None:
        source = f"budget_mb = {memory.budget_mb:g}"
    elif total is None:
        return Check("memory budget", "info", f"budget_percent = {memory.budget_percent:g} of an unknown MemTotal; "
                     f"{detail_policy}")
    else:
        source = f"budget_percent = {memory.budget_percent:g} of MemTotal"
    limit = budget_bytes(memory, total or 0) or 0
    detail = f"{size(limit)} ({source}); {detail_policy}"
    if total is not None and limit > total:
        return Check("memory budget", "warn", f"{detail}: more than MemTotal {size(total)}, so it never limits",
                     f"lower [memory] budget_mb below {total // MIB} (or use budget_percent)")
    return Check("memory budget", "ok", detail)


def check_daemon_memory(block: Mapping[str, Any], configured_allocator: str) -> Check:
    """The ``memory`` block of the daemon's ``/v2/edged/status``: budget use, charges, pressure, allocator."""
    limit, used = block.get("budget_bytes"), int(block.get("used_bytes") or 0)
    charges = sorted(dict(block.get("charges") or {}).items(), key=lambda item: -int(item[1]))
    parts = [f"used {size(used)} of {size(limit)} ({used / limit:.0%})" if limit else f"used {size(used)}, no "
             "budget", "charges: " + (", ".join(f"{key} {size(int(value))}" for key, value in charges) or "none"),
             f"policy {block.get('policy', '?')}", f"allocator {block.get('allocator') or '?'}",
             f"under pressure: {'yes' if block.get('under_pressure') else 'no'}"]
    problems: list[tuple[str, str]] = []
    if block.get("under_pressure"):
        problems.append((f"under memory pressure ({block.get('pressure_reason') or 'no reason given'}): new loads "
                         "are refused", "unload models (edged models unload NAME) or lower [memory] budget_mb; "
                         "stop other memory users"))
    if limit and used >= BUDGET_NEARLY_FULL * limit:
        problems.append((f"the budget is {used / limit:.0%} used", "raise [memory] budget_mb (if MemAvailable "
                         "allows) or unload a model"))
    if configured_allocator != "system" and block.get("allocator") != configured_allocator:
        problems.append((f"the daemon runs on {block.get('allocator')} although [memory] allocator = "
                         f"{configured_allocator}", "see the allocator row above, then restart the daemon"))
    detail = "; ".join(parts)
    if not problems:
        return Check("memory (daemon)", "ok", detail)
    return Check("memory (daemon)", "warn", detail + ". " + "; ".join(p for p, _ in problems) + ".",
                 "; ".join(fix for _, fix in problems))


def check_telemetry(telemetry: Any, jetson: bool) -> Check:
    module, _ = _import("edged.telemetry")
    describe = getattr(module, "describe_source", None)
    if callable(describe):
        return Check("telemetry", "info", str(describe(telemetry)))
    path = str(getattr(telemetry, "tegrastats_path", "/usr/bin/tegrastats"))
    source = str(getattr(telemetry, "source", "auto"))
    if shutil.which(path) or (os.path.isfile(path) and os.access(path, os.X_OK)):
        return Check("telemetry", "ok", f"source {source}; tegrastats at {path}")
    if jetson:
        return Check("telemetry", "warn", f"source {source}; no tegrastats at {path}",
                     "sudo apt install nvidia-l4t-tools, or set [telemetry] tegrastats_path")
    return Check("telemetry", "info", f"source {source}; no tegrastats (not a Jetson): sysfs or off")


def check_disk(name: str, path: str | None) -> Check:
    if path is None:
        return Check(f"disk ({name})", "info", "not configured")
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    usage = shutil.disk_usage(existing)
    free_mb = usage.free / 2**20
    detail = f"{path}: {free_mb:,.0f} MiB free of {usage.total / 2**20:,.0f} MiB"
    if free_mb < 256:
        return Check(f"disk ({name})", "fail", detail, f"free space on the file system of {existing}")
    if free_mb < 1024 or usage.free < usage.total * 0.05:
        return Check(f"disk ({name})", "warn", detail, f"free space on the file system of {existing}")
    return Check(f"disk ({name})", "ok", detail)


def check_outbox_disk(outbox: Mapping[str, Any]) -> Check:
    """The ``outbox`` block of the daemon's mqtt status: whether results can be stored, and the space left."""
    free = outbox.get("disk_free_bytes", -1)
    free_text = f"{free / MIB:,.1f} MiB free in the state directory" if isinstance(free, int) and free >= 0 \
        else "free space unknown"
    state = outbox.get("disk", "ok")
    if state == "ok":
        return Check("mqtt outbox disk", "ok", f"writes succeed; {free_text}")
    detail = (f"outbox writes fail ({outbox.get('disk_error', '')}); {outbox.get('depth', '?')} results wait, "
              f"the newest in memory only; {free_text}")
    return Check("mqtt outbox disk", "fail", detail,
                 "free space in the state directory (e.g. /var/lib/edged): the outbox resumes by itself")


def check_service() -> Check:
    systemctl = shutil.which("systemctl")
    if systemctl is None or not Path("/run/systemd/system").is_dir():
        return Check("service", "info", "systemd is not running here; start the daemon with `edged serve`")
    result = subprocess.run([systemctl, "is-active", "edged.service"], capture_output=True, text=True,
                            timeout=10, check=False)
    state = result.stdout.strip() or result.stderr.strip()
    if state == "active":
        return Check("service", "ok", "edged.service is active")
    fix = "sudo systemctl start edged; see why it stopped: journalctl -u edged -b"
    return Check("service", "fail" if state == "failed" else "warn", f"edged.service is {state}", fix)


def broker_address(url: str) -> tuple[str, int]:
    match = re.fullmatch(r"(?:(mqtts?|tcp|ssl)://)?\[?([^\]/]+?)\]?(?::(\d+))?/?", url)
    if not match:
        raise ValueError(f"expected mqtt://host:port, found {url!r}")
    scheme, host, port = match.groups()
    return host, int(port) if port else (8883 if scheme in ("mqtts", "ssl") else 1883)
