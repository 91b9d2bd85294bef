"""Model bundles: a tar of one model version (config.pbtxt, the version folder, optional labels) plus
``test_vectors.json``.

Building is deterministic (sorted members, zero mtimes, no owners) so the same model gives the same hash.
Extraction trusts nothing in the archive (its signature says who built it, not that the build was sound): every
header is checked before a byte is written: only regular files (no folders, links, devices, or sparse files,
whose few stored bytes may declare gigabytes), every path confined below the model folder, and the declared
sizes, each member's against what is left of the byte limit, their sum against the free space of the
destination. The limit is the bundle's own size: an uncompressed tar stores every byte of a regular member, so
members declaring more than the archive holds are refused. Members are copied to disk in 1 MiB chunks; only
``test_vectors.json`` (at most `MAX_VECTORS_BYTES`) is read into memory.
"""

from __future__ import annotations

import errno
import io
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.errors import DiskFull, UpdateRejected
from edged.repository import check_model_name

TEST_VECTORS = "test_vectors.json"
MAX_VECTORS_BYTES = 64 << 20  # parsed in memory: a bound of its own, whatever the bundle's size
MAX_MEMBERS = 10_000  # each header costs memory while the archive is checked
COPY_CHUNK_BYTES = 1 << 20
# tarfile's isfile() also accepts CONTTYPE and GNUTYPE_SPARSE: the two kinds of plain member are named instead
_PLAIN_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)


@dataclass(frozen=True)
class TestVector:
    inputs: dict[str, Any]  # a KServe v2 inference request
    outputs: list[dict[str, Any]]  # KServe v2 output tensors: name, datatype, shape, data
    rtol: float
    atol: float


def build_bundle(model_dir: Path, version: int, vectors: bytes, destination: Path,
                 build_spec: bytes | None = None) -> None:
    """``build_spec``: stored as ``<model>/<version>/build_spec.json``: the device builds its engine from it."""
    name = model_dir.name
    check_model_name(name)
    version_dir = model_dir / str(version)
    if not version_dir.is_dir():
        raise UpdateRejected(f"model {name}: no version folder {version_dir}")
    if not (model_dir / "config.pbtxt").is_file():
        raise UpdateRejected(f"model {name}: a bundle needs {model_dir / 'config.pbtxt'}")
    parse_vectors(vectors)
    if build_spec is not None and (version_dir / "build_spec.json").exists():
        raise UpdateRejected(f"model {name}: {version_dir / 'build_spec.json'} exists and --build-spec was given: "
                             "keep one")
    labels = sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix == ".txt")
    files = [model_dir / "config.pbtxt", *labels]
    files += sorted(p for p in version_dir.rglob("*") if p.is_file())
    with tarfile.open(destination, "w") as tar:
        for path in files:
            _add(tar, f"{name}/{path.relative_to(model_dir).as_posix()}", path.read_bytes())
        if build_spec is not None:
            _add(tar, f"{name}/{version}/build_spec.json", build_spec)
        _add(tar, TEST_VECTORS, vectors)


def _add(tar: tarfile.TarFile, arcname: str, data: bytes) -> None:
    info = tarfile.TarInfo(arcname)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def extract_bundle(bundle: Path, model: str, version: int, destination: Path) -> list[TestVector]:
    """Unpack into ``destination/<model>/``; returns the test vectors. Anything unexpected is refused, every
    header before anything is written."""
    try:
        with tarfile.open(bundle, "r:") as tar:
            members = _checked_members(tar, bundle, model, version)
            _check_space(members, bundle, destination)
            vectors = b""
            for member in members:
                stream = tar.extractfile(member)
                if stream is None:
                    raise UpdateRejected(f"bundle member {member.name!r} cannot be read")
                with stream:
                    if member.name == TEST_VECTORS:
                        vectors = stream.read()  # its size was checked against MAX_VECTORS_BYTES
                        continue
                    target = destination / member.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with target.open("wb") as out:
                        shutil.copyfileobj(stream, out, COPY_CHUNK_BYTES)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise DiskFull(f"disk: no space left unpacking {bundle.name} into {destination}: {e}") from e
        raise UpdateRejected(f"bundle {bundle.name}: cannot unpack: {e}") from e
    except tarfile.TarError as e:
        raise UpdateRejected(f"bundle {bundle.name}: cannot unpack: {e}") from e
    if not (destination / model / str(version)).is_dir():
        raise UpdateRejected(f"bundle {bundle.name}: no version folder {model}/{version}")
    if not (destination / model / "config.pbtxt").is_file():
        raise UpdateRejected(f"bundle {bundle.name}: no {model}/config.pbtxt")
    if not any(member.name == TEST_VECTORS for member in members):
        raise UpdateRejected(f"bundle {bundle.name}: no {TEST_VECTORS}")
    return parse_vectors(vectors)


def _checked_members(tar: tarfile.TarFile, bundle: Path, model: str, version: int) -> list[tarfile.TarInfo]:
    """Every header, each checked; the declared sizes within the bundle's own size (see the module's doc)."""
    limit = bundle.stat().st_size
    left = limit
    members: list[tarfile.TarInfo] = []
    for member in tar:
        if len(members) == MAX_MEMBERS:
            raise UpdateRejected(f"bundle {bundle.name}: more than {MAX_MEMBERS} members")
        _check_member(member, model, version)
        if member.size > left:
            raise UpdateRejected(f"bundle member {member.name!r}: declares {member.size} bytes, more than the "
                                 f"{left} left of the bundle's {limit} (members cannot hold more than the "
                                 "archive stores)")
        if member.name == TEST_VECTORS and member.size > MAX_VECTORS_BYTES:
            raise UpdateRejected(f"bundle member {member.name!r}: {member.size} bytes, more than the "
                                 f"{MAX_VECTORS_BYTES} test vectors may have")
        left -= member.size
        members.append(member)
    return members


def _check_member(member: tarfile.TarInfo, model: str, version: int) -> None:
    parts = member.name.split("/")
    if member.type not in _PLAIN_FILE_TYPES or member.issparse():
        raise UpdateRejected(f"bundle member {member.name!r} is {_kind(member)}: only regular files are allowed")
    if ".." in parts or member.name.startswith("/") or "" in parts:
        raise UpdateRejected(f"bundle member {member.name!r}: only plain files with relative paths are allowed")
    allowed = member.name == TEST_VECTORS or (parts[0] == model and (
        len(parts) == 2 or (len(parts) > 2 and parts[1] == str(version))))
    if not allowed:
        raise UpdateRejected(f"bundle member {member.name!r}: expected {TEST_VECTORS}, {model}/<file> or "
                             f"{model}/{version}/...")


def _kind(member: tarfile.TarInfo) -> str:
    if member.issparse() or member.type == tarfile.GNUTYPE_SPARSE:  # pax sparse files are REGTYPE with a map
        return "a sparse file"
    if member.isdir():
        return "a folder"
    if member.issym() or member.islnk():
        return "a link"
    return f"of tar type {member.type!r}"


def _check_space(members: list[tarfile.TarInfo], bundle: Path, destination: Path) -> None:
    needed = sum(member.size for member in members if member.name != TEST_VECTORS)
    free = shutil.disk_usage(destination).free
    if needed > free:
        raise DiskFull(f"disk: unpacking {bundle.name} needs {needed} bytes in {destination}, {free} are free")


def parse_vectors(raw: bytes) -> list[TestVector]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise UpdateRejected(f"{TEST_VECTORS}: not valid JSON: {e}") from e
    if not isinstance(doc, list) or not doc:
        raise UpdateRejected(f"{TEST_VECTORS}: expected a non-empty list of test vectors")
    vectors = []
    for i, entry in enumerate(doc):
        if not isinstance(entry, dict) or not isinstance(entry.get("inputs"), dict) \
                or not isinstance(entry.get("outputs"), list):
            raise UpdateRejected(f"{TEST_VECTORS}[{i}]: expected {{\"inputs\": <request>, \"outputs\": [...], "
                                 "\"rtol\": r, \"atol\": a}")
        rtol, atol = entry.get("rtol", 1e-5), entry.get("atol", 1e-6)
        if not isinstance(rtol, int | float) or not isinstance(atol, int | float) or rtol < 0 or atol < 0:
            raise UpdateRejected(f"{TEST_VECTORS}[{i}]: rtol and atol must be numbers >= 0")
        vectors.append(TestVector(entry["inputs"], entry["outputs"], float(rtol), float(atol)))
    return vectors
