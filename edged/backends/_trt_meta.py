"""What an engine is tied to, recorded beside it, and the check that refuses a mismatched engine.

A TensorRT plan runs only with the TensorRT version and the GPU architecture it was built for. `edged
build-engine` writes ``model.plan.json`` next to ``model.plan``: TensorRT version, device name, compute
capability, L4T release, build flags, the source ONNX's sha256 and the exact command that built it. At load
the backend compares the sidecar with the running system; a mismatch is refused with the command that
rebuilds the engine. A missing sidecar loads with a warning (engines built by trtexec or Triton tooling).
Pure apart from reading and writing the sidecar and /etc/nv_tegra_release.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edged.errors import ModelLoadError

log = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".json"
SIDECAR_FORMAT = 1
NV_TEGRA_RELEASE = Path("/etc/nv_tegra_release")
_L4T_LINE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)\.(\d+)")


@dataclass(frozen=True)
class TrtCapabilities:
    """What the installed TensorRT Python API offers, decided from its version (JetPack: 8.5 to 10.x)."""

    version: str
    major: int
    minor: int

    @classmethod
    def from_version(cls, version: str) -> TrtCapabilities:
        match = re.match(r"(\d+)\.(\d+)", version)
        if match is None:
            raise ModelLoadError(f"TensorRT version {version!r}: expected MAJOR.MINOR[.PATCH...]")
        return cls(version=version, major=int(match[1]), minor=int(match[2]))

    @property
    def name_based_io(self) -> bool:  # num_io_tensors, set_input_shape, execute_async_v3
        return (self.major, self.minor) >= (8, 5)

    @property
    def allocation_strategies(self) -> bool:  # ExecutionContextAllocationStrategy
        return self.major >= 10

    @property
    def device_memory_v2(self) -> bool:  # device_memory_size_v2, set_device_memory(ptr, size)
        return (self.major, self.minor) >= (10, 1)

    @property
    def progress_monitor(self) -> bool:  # IProgressMonitor for builds
        return self.major >= 10


@dataclass(frozen=True)
class EngineMeta:
    """The sidecar: what the engine was built with and for."""

    tensorrt_version: str
    device_name: str
    compute_capability: str
    l4t_release: str | None = None
    build_flags: dict[str, Any] = field(default_factory=dict)
    source_onnx_sha256: str | None = None
    build_command: tuple[str, ...] = ()
    format: int = SIDECAR_FORMAT

    def to_json(self) -> str:
        data = asdict(self)
        data["build_command"] = list(self.build_command)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, origin: str) -> EngineMeta:
        try:
            data = json.loads(text)
            return cls(
                tensorrt_version=str(data["tensorrt_version"]), device_name=str(data["device_name"]),
                compute_capability=str(data["compute_capability"]), l4t_release=data.get("l4t_release"),
                build_flags=dict(data.get("build_flags") or {}),
                source_onnx_sha256=data.get("source_onnx_sha256"),
                build_command=tuple(str(a) for a in data.get("build_command") or ()),
                format=int(data.get("format", SIDECAR_FORMAT)))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"engine sidecar {origin}: expected a JSON object with tensorrt_version, "
                                 f"device_name and compute_capability, found an unreadable file ({e})") from e


@dataclass(frozen=True)
class RuntimeIdentity:
    """What the running system is: compared with an EngineMeta at load."""

    tensorrt_version: str
    device_name: str
    compute_capability: str
    l4t_release: str | None = None


def sidecar_path(plan: Path) -> Path:
    return plan.with_name(plan.name + SIDECAR_SUFFIX)


def parse_l4t_release(text: str) -> str | None:
    """'# R36 (release), REVISION: 4.3, GCID: ...' → '36.4.3'."""
    match = _L4T_LINE.search(text)
    return f"{match[1]}.{match[2]}.{match[3]}" if match else None


def read_l4t_release(path: Path = NV_TEGRA_RELEASE) -> str | None:
    try:
        return parse_l4t_release(path.read_text(errors="replace"))
    except OSError:
        return None


def read_sidecar(plan: Path) -> EngineMeta | None:
    path = sidecar_path(plan)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ModelLoadError(f"engine sidecar {path}: cannot be read ({e})") from e
    return EngineMeta.from_json(text, str(path))


def write_file_atomically(path: Path, data: bytes) -> None:
    """temp file in the same directory → fsync → os.replace → fsync of the directory."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_sidecar(plan: Path, meta: EngineMeta) -> Path:
    path = sidecar_path(plan)
    write_file_atomically(path, meta.to_json().encode())
    return path


def rebuild_hint(plan: Path, meta: EngineMeta | None) -> str:
    if meta is not None and meta.build_command:
        return f"rebuild it on this device with: {shlex.join(meta.build_command)}"
    onnx = plan.with_suffix(".onnx")
    return (f"rebuild it on this device from its ONNX model, e.g.: edged build-engine "
            f"{shlex.quote(str(onnx))} --output {shlex.quote(str(plan))}")


def mismatches(meta: EngineMeta, here: RuntimeIdentity) -> list[str]:
    """The differences that make the engine unusable here (TensorRT version, GPU architecture)."""
    problems = []
    version_compatible = bool(meta.build_flags.get("version_compatible"))
    built, running = meta.tensorrt_version, here.tensorrt_version
    same = built.split(".")[0] == running.split(".")[0] if version_compatible else built == running
    if not same:
        problems.append(f"built with TensorRT {built}, this system has TensorRT {running}")
    if meta.compute_capability != here.compute_capability:
        problems.append(f"built for compute capability {meta.compute_capability} ({meta.device_name}), this "
                        f"device is {here.compute_capability} ({here.device_name})")
    return problems


def check_compatible(plan: Path, meta: EngineMeta | None, here: RuntimeIdentity) -> list[str]:
    """Raise ModelLoadError on a mismatch; return warnings (missing sidecar, other device or L4T)."""
    if meta is None:
        return [f"engine {plan} has no sidecar {sidecar_path(plan).name}: its TensorRT version and device "
                f"cannot be checked; build engines with edged build-engine to record them"]
    problems = mismatches(meta, here)
    if problems:
        raise ModelLoadError(f"engine {plan} does not match this system: {'; '.join(problems)}; "
                             f"{rebuild_hint(plan, meta)}")
    warnings = []
    if meta.device_name != here.device_name:
        warnings.append(f"engine {plan} was built on {meta.device_name}, this device is {here.device_name} "
                        f"(same compute capability {here.compute_capability}); tactics may be slower")
    if meta.l4t_release and here.l4t_release and meta.l4t_release != here.l4t_release:
        warnings.append(f"engine {plan} was built on L4T {meta.l4t_release}, this device runs L4T "
                        f"{here.l4t_release}")
    return warnings


def describe_meta(meta: EngineMeta | None) -> Mapping[str, Any]:
    return {} if meta is None else {"built_with_tensorrt": meta.tensorrt_version,
                                    "built_on": meta.device_name, "build_flags": dict(meta.build_flags)}
