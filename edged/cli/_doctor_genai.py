"""``edged doctor``'s check that the onnxruntime-genai build matches the onnxruntime build.

ORT GenAI ships no ONNX Runtime of its own: it loads the ``libonnxruntime`` it finds, normally the one of the
installed onnxruntime (or onnxruntime-gpu) package. A mismatch fails at load or, worse, at the first token:
an onnxruntime older than ORT GenAI requires, two different ONNX Runtime libraries mapped into one process
(a system copy and the package's), or a CUDA build of ORT GenAI over an onnxruntime without the CUDA provider
(on a Jetson: NVIDIA's onnxruntime-gpu is needed under the community's CUDA onnxruntime-genai). The facts are
gathered in `genai_facts` (imports, package metadata, the process's memory map) and judged in `judge_genai`,
which does no I/O, so it is tested on recorded facts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from edged.cli._doctor_checks import Check, _import

NAME = "ONNX Runtime GenAI"
_ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino")
_LIBRARY = re.compile(r"/libonnxruntime\.so(?:\.(\d+\.\d+\.\d+))?$")
_MINIMUM = re.compile(r"^(onnxruntime[\w-]*)\s*(?:\[[^]]*\])?\s*>=\s*([\d.]+)")


@dataclass(frozen=True)
class GenaiFacts:
    genai_version: str
    genai_cuda: bool  # the build can run on CUDA
    requires: tuple[str, ...]  # its Requires-Dist lines naming an onnxruntime distribution
    ort_distribution: str | None  # the installed onnxruntime flavour, None when none is installed
    ort_version: str | None
    ort_providers: tuple[str, ...]
    ort_package_dir: str | None  # where the onnxruntime package lives
    libraries: tuple[str, ...]  # the libonnxruntime files mapped into this process after importing both


def judge_genai(facts: GenaiFacts, jetson: bool) -> Check:
    detail = f"onnxruntime-genai {facts.genai_version}"
    if facts.ort_distribution is None or facts.ort_version is None:
        return Check(NAME, "fail", detail + ", but no onnxruntime package is installed",
                     "install the onnxruntime build ORT GenAI requires (onnxruntime-gpu on a Jetson)")
    detail += f" over {facts.ort_distribution} {facts.ort_version}"
    for line in facts.requires:
        found = _MINIMUM.match(line)
        if found and _version(facts.ort_version) < _version(found.group(2)):
            return Check(NAME, "fail", f"{detail}: onnxruntime-genai requires {line}",
                         f"upgrade {facts.ort_distribution} to {found.group(2)} or later, or install the "
                         "onnxruntime-genai release built for this onnxruntime")
    distinct = sorted(set(facts.libraries))
    if len(distinct) > 1:
        return Check(NAME, "fail", f"{detail}: two ONNX Runtime libraries in one process: {', '.join(distinct)}",
                     "remove the copy outside the onnxruntime package (or its directory from LD_LIBRARY_PATH)")
    if distinct and facts.ort_package_dir and not Path(distinct[0]).is_relative_to(facts.ort_package_dir):
        return Check(NAME, "warn", f"{detail}: ORT GenAI loaded {distinct[0]}, not the onnxruntime package's "
                     f"library under {facts.ort_package_dir}", "remove the other copy from the library path")
    loaded = _LIBRARY.search(distinct[0]) if distinct else None
    if loaded and loaded.group(1) and loaded.group(1) != facts.ort_version:
        return Check(NAME, "fail", f"{detail}: the library loaded is ONNX Runtime {loaded.group(1)}",
                     f"reinstall {facts.ort_distribution} so that its library and its Python module agree")
    cuda_provider = "CUDAExecutionProvider" in facts.ort_providers
    if facts.genai_cuda and not cuda_provider:
        return Check(NAME, "fail", f"{detail}: a CUDA build of onnxruntime-genai over an onnxruntime without "
                     "the CUDA provider", "install onnxruntime-gpu (NVIDIA's wheel for your JetPack on a Jetson)")
    if jetson and not facts.genai_cuda:
        return Check(NAME, "warn", detail + " (a CPU build: generation does not use the GPU)",
                     "install a CUDA build of onnxruntime-genai for your JetPack beside NVIDIA's onnxruntime-gpu")
    return Check(NAME, "ok", detail + (", CUDA" if facts.genai_cuda else ", CPU"))


def check_genai(jetson: bool, maps: Path = Path("/proc/self/maps")) -> Check:
    og, error = _import("onnxruntime_genai")
    if og is None:
        return Check(NAME, "info", f"not installed ({error}): generative models are unavailable",
                     "install edged with the 'genai' extra")
    return judge_genai(genai_facts(og, maps), jetson)


def genai_facts(og: object, maps: Path) -> GenaiFacts:
    ort, _ = _import("onnxruntime")
    distribution = next((d for d in _ORT_DISTRIBUTIONS if _installed(d)), None)
    requires = tuple(r for r in (_requires("onnxruntime-genai") or _requires("onnxruntime-genai-cuda"))
                     if r.startswith("onnxruntime"))
    cuda = getattr(og, "is_cuda_available", None)
    try:
        mapped = maps.read_text().splitlines()
    except OSError:
        mapped = []
    libraries = tuple(sorted({line.split()[-1] for line in mapped if _LIBRARY.search(line.split()[-1])}))
    providers = tuple(ort.get_available_providers()) if ort is not None else ()
    return GenaiFacts(str(getattr(og, "__version__", "?")), bool(cuda()) if callable(cuda) else False, requires,
                      distribution, metadata.version(distribution) if distribution else None, providers,
                      _package_dir(ort), libraries)


def _package_dir(ort: object) -> str | None:
    """The onnxruntime package's folder with every symlink resolved, as /proc/self/maps names the library it
    mapped: a virtual environment reached through a symlink must not look like a second copy."""
    where = getattr(ort, "__file__", None) if ort is not None else None
    return str(Path(where).resolve().parent) if where else None


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def _requires(distribution: str) -> list[str]:
    try:
        return list(metadata.requires(distribution) or [])
    except metadata.PackageNotFoundError:
        return []


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])
