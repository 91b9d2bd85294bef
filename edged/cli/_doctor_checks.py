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

from edged.cli._doctor_platform import l4t_release, module_model

Status = Literal["ok", "warn", "fail", "info"]


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


def check_allocator(configured: str, env: Mapping[str, str]) -> Check:
    module, _ = _import("edged.memory")
    probe = getattr(module, "active_allocator", None)
    # Without the memory part (older trees), look for the libraries ourselves.
    state = probe() if callable(probe) else None
    active = _describe_allocator(state) if state is not None else _allocator_from_maps(env)
    detail = f"configured: {configured}; in this process: {active}"
    warning = getattr(state, "warning", None)
    if warning:
        return Check("allocator", "warn", f"{detail}: {warning}",
                     "see systemd/edged-allocator.conf.example and [memory] allocator")
    if configured != "system" and configured not in active:
        return Check("allocator", "warn", detail + " (the daemon's own process may differ)",
                     f"install {configured} (Ubuntu: libjemalloc2 or libtcmalloc-minimal4) and see "
                     "systemd/edged-allocator.conf.example")
    return Check("allocator", "info", detail)


def _describe_allocator(state: object) -> str:
    name = getattr(state, "name", None)
    if name is None:
        return str(state)
    library = getattr(state, "library", None)
    return f"{name} ({library})" if library else str(name)


def _allocator_from_maps(env: Mapping[str, str]) -> str:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    for name in ("jemalloc", "tcmalloc"):
        if f"lib{name}" in maps or f"lib{name}" in env.get("LD_PRELOAD", ""):
            return name
    return "glibc malloc"


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
