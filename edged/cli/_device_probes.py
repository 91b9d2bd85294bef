"""The device report's probes of what the machine has: TensorRT and CUDA, telemetry sources (checked against
each other), memory as the kernel counts it, and the ``hardware`` tests of a source checkout.

Every probe returns a `Step`; where the hardware or tool is absent the step says ``skipped: <reason>``, never
a made-up figure.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from edged.config import TelemetryConfig
from edged.telemetry import Sample, open_source

Status = Literal["ok", "failed", "skipped"]
SAMPLE_TIMEOUT_S = 15.0
HARDWARE_TESTS_TIMEOUT_S = 1800
# tegrastats and sysfs read the same counters at slightly different instants
RAM_TOLERANCE_MB = 256
TEMP_TOLERANCE_C = 5.0


@dataclass(frozen=True)
class Step:
    name: str
    status: Status
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def skipped(name: str, reason: str) -> Step:
    return Step(name, "skipped", f"skipped: {reason}")


def tensorrt_missing() -> str:
    """Why no TensorRT engine can be built here ("" when one can)."""
    if importlib.util.find_spec("tensorrt") is None:
        return "TensorRT is not installed (import tensorrt fails); on a Jetson it comes with JetPack"
    from edged.backends._trt_cuda import CudaError, load_cuda_api

    try:
        load_cuda_api().device_properties(0)
    except CudaError as e:
        return f"no usable CUDA device: {e}"
    return ""


def memory_now(root: Path) -> dict[str, int]:
    """MemAvailable (the whole system: on unified memory the GPU's allocations too) and this process's RSS."""
    meminfo = (root / "proc" / "meminfo").read_text()
    found = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.MULTILINE)
    status = Path("/proc/self/status").read_text()
    rss = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    if found is None or rss is None:
        raise ValueError(f"{root / 'proc' / 'meminfo'} or /proc/self/status lacks MemAvailable / VmRSS")
    return {"mem_available_kib": int(found.group(1)), "rss_kib": int(rss.group(1))}


def _present(config: TelemetryConfig, source: str) -> str:
    """Why ``source`` cannot be read here ("" when it can)."""
    if source == "tegrastats":
        return "" if os.access(config.tegrastats_path, os.X_OK) else f"no executable {config.tegrastats_path}"
    if source == "jtop":
        if importlib.util.find_spec("jtop") is None:
            return "jetson-stats is not installed (pip install edged[jetson])"
        return "" if os.path.exists(config.jtop_socket) else f"the jtop service is not running ({config.jtop_socket})"
    root = Path(config.sysfs_root)
    return "" if (root / "proc" / "stat").is_file() else f"no {root / 'proc' / 'stat'}"


def _one_sample(config: TelemetryConfig) -> Sample:
    source = open_source(config)
    if source is None:
        raise ValueError(f"telemetry source {config.source!r} is off")
    stop = threading.Event()
    timer = threading.Timer(SAMPLE_TIMEOUT_S, stop.set)  # a source that never answers must not hang the report
    timer.start()
    try:
        sample = source.next_sample(stop)
    finally:
        timer.cancel()
        source.close()
    if sample is None:
        raise ValueError(f"{config.source}: no sample within {SAMPLE_TIMEOUT_S:.0f} s")
    return sample


def telemetry_steps(context: Any) -> list[Step]:
    base = TelemetryConfig(sysfs_root=str(context.root))
    steps: list[Step] = []
    samples: dict[str, Sample] = {}
    for name in ("tegrastats", "jtop", "sysfs"):
        reason = _present(base, name)
        if reason:
            steps.append(skipped(f"telemetry {name}", reason))
            continue
        sample = _one_sample(replace(base, source=name))
        samples[name] = sample
        steps.append(Step(f"telemetry {name}", "ok", _describe(sample), sample.to_json()))
    steps.append(_compare(samples.get("sysfs"), samples.get("tegrastats")))
    return steps


def _describe(sample: Sample) -> str:
    parts = [f"RAM {sample.ram_used_mb}/{sample.ram_total_mb} MB", f"{len(sample.cpu)} CPUs",
             f"{len(sample.temps_c)} temperatures", f"{len(sample.power_mw)} power rails"]
    if sample.gpu_load_pct is not None:
        parts.append(f"GPU {sample.gpu_load_pct}%")
    return ", ".join(parts)


def _zone(name: str) -> str:
    return re.sub(r"[-_]?thermal$", "", name.lower())


def _compare(sysfs: Sample | None, tegrastats: Sample | None) -> Step:
    """sysfs against tegrastats: the same RAM and, zone by zone, the same temperatures."""
    if sysfs is None or tegrastats is None:
        missing = " and ".join(n for n, s in (("sysfs", sysfs), ("tegrastats", tegrastats)) if s is None)
        return skipped("telemetry sysfs vs tegrastats", f"no {missing} sample to compare")
    problems = []
    ram = abs(sysfs.ram_used_mb - tegrastats.ram_used_mb)
    if ram > RAM_TOLERANCE_MB:
        problems.append(f"RAM used differs by {ram} MB")
    theirs = {_zone(k): v for k, v in tegrastats.temps_c.items()}
    compared = {}
    for name, value in sysfs.temps_c.items():
        if _zone(name) in theirs:
            compared[_zone(name)] = (value, theirs[_zone(name)])
            if abs(value - theirs[_zone(name)]) > TEMP_TOLERANCE_C:
                problems.append(f"{name}: sysfs {value} C, tegrastats {theirs[_zone(name)]} C")
    data = {"ram_diff_mb": ram, "temperatures": compared}
    if not compared:
        problems.append("no temperature zone common to both: the zone names do not match")
    status: Status = "failed" if problems else "ok"
    detail = "; ".join(problems) or f"RAM within {ram} MB, {len(compared)} zones within {TEMP_TOLERANCE_C} C"
    return Step("telemetry sysfs vs tegrastats", status, detail, data)


def hardware_tests_step(context: Any) -> Step:
    tests: Path | None = context.tests
    if importlib.util.find_spec("pytest") is None:
        return skipped("hardware tests", "pytest is not installed (pip install edged[dev])")
    if tests is None:
        return skipped("hardware tests", "no tests directory: pass --tests DIR (tests/ of an edged source checkout)")
    command = [sys.executable, "-m", "pytest", str(tests), "-m", "hardware", "-q", "-rs", "-p", "no:cacheprovider"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=HARDWARE_TESTS_TIMEOUT_S,
                            check=False)
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr.strip()[-300:]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error|deselected)", tail)}
    # exit status 5: every test was deselected or skipped, which proves nothing but fails nothing either
    status: Status = "ok" if result.returncode in (0, 5) and not counts.get("failed") else "failed"
    if status == "ok" and not counts.get("passed"):
        status, tail = "skipped", f"skipped: no hardware test ran ({tail})"
    return Step("hardware tests", status, tail, {"command": command, "exit_status": result.returncode,
                                                 "counts": counts, "output_tail": result.stdout[-4000:]})
