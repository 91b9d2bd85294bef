"""Which targets a device takes: its rollout bucket and its compatibility (its id: `edged.config` resolves it).

The bucket is ``sha256("<cohort_salt>:<device_id>")[:8] % 100``: stable for a device and a target, independent
across targets (each has its own salt), so a wave of 10 % is the same 10 % of the fleet until promoted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged import __version__
from edged.platform import l4t_release, module_model, tensorrt_version


def bucket(cohort_salt: str, device_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{cohort_salt}:{device_id}".encode()).digest()[:8], "big") % 100


@dataclass(frozen=True)
class DeviceFacts:
    """What compatibility is judged against: the module, its L4T release and JetPack label, the TensorRT version
    (`device_facts` reads them on the device); empty where the machine is not a Jetson."""

    module: str = ""
    jetpack: str = ""
    l4t: str = ""
    tensorrt: str = ""
    edged_version: str = __version__


def device_facts(root: Path = Path("/")) -> DeviceFacts:
    """This device's facts, from the files ``edged doctor`` reads (under ``root``, for tests and images)."""
    _, release = l4t_release(root)
    return DeviceFacts(module=module_model(root) or "", jetpack=(release.jetpack or "") if release else "",
                       l4t=release.version if release else "", tensorrt=tensorrt_version())


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _in_range(actual: str, wanted: str) -> bool:
    """``wanted`` is ``X`` (prefix match), ``>=X``, or ``X-Y`` (inclusive range)."""
    if not actual:
        return False
    if wanted.startswith(">="):
        return _version_tuple(actual) >= _version_tuple(wanted[2:])
    if "-" in wanted:
        low, high = wanted.split("-", 1)
        return _version_tuple(low) <= _version_tuple(actual) <= _version_tuple(high)
    size = len(_version_tuple(wanted))
    return _version_tuple(actual)[:size] == _version_tuple(wanted)


def incompatibility(compat: dict[str, Any], facts: DeviceFacts) -> str:
    """Why the target does not fit this device, or "" when it does."""
    for key, wanted in sorted(compat.items()):
        wanted = str(wanted)
        if key == "min_edged_version":
            if _version_tuple(facts.edged_version) < _version_tuple(wanted):
                return f"needs edged >= {wanted}, this is {facts.edged_version}"
        elif key == "module":
            if facts.module != wanted:
                return f"built for module {wanted}, this device is {facts.module or 'unknown'}"
        elif key in ("jetpack", "l4t", "tensorrt"):
            actual = getattr(facts, key)
            if not _in_range(actual, wanted):
                return f"needs {key} {wanted}, this device has {actual or 'none'}"
        else:
            return f"unknown compatibility key {key!r} (this edged {facts.edged_version} knows module, jetpack, " \
                   "l4t, tensorrt, min_edged_version)"
    return ""


def skip_reason(custom: dict[str, Any], device_id: str, facts: DeviceFacts) -> str:
    """"" when this device takes the target now, else why not (incompatible, or outside the wave)."""
    problem = incompatibility(dict(custom.get("compat") or {}), facts)
    if problem:
        return f"incompatible: {problem}"
    percent = int(custom.get("percent", 100))
    mine = bucket(str(custom.get("cohort_salt", "")), device_id)
    if mine >= percent:
        return f"not in this wave: device bucket {mine} >= rollout percent {percent}"
    return ""
