"""Extraction of a model bundle, on real tars built here (GNU tar for the sparse ones): every header checked
before a byte is written; sparse, linked and special members refused, sizes bounded by what the archive holds,
and members copied to disk in chunks, never read whole into memory."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from edged.errors import UpdateRejected
from edged.ota._bundle import COPY_CHUNK_BYTES, TEST_VECTORS, extract_bundle

MODEL, VERSION = "mlp", 1
VECTORS = json.dumps([{"inputs": {"inputs": []}, "outputs": []}]).encode()
SPARSE_BYTES = 64 << 20  # declared; the tar stores a few blocks of it


def _source(root: Path) -> Path:
    """A bundle's files on disk: config.pbtxt, one version file, the test vectors."""
    (root / MODEL / str(VERSION)).mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(f'name: "{MODEL}"\n')
    (root / MODEL / str(VERSION) / "model.onnx").write_bytes(b"onnx" * 256)
    (root / TEST_VECTORS).write_bytes(VECTORS)
    return root


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", **fields: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if data else None)


def _bundle(tmp_path: Path, extra: list[tuple[str, bytes, dict[str, object]]] = ()) -> Path:  # type: ignore[assignment]
    path = tmp_path / "bundle.tar"
    with tarfile.open(path, "w") as tar:
        _add(tar, f"{MODEL}/config.pbtxt", f'name: "{MODEL}"\n'.encode())
        _add(tar, f"{MODEL}/{VERSION}/model.onnx", b"onnx" * 256)
        for name, data, fields in extra:
            _add(tar, name, data, **fields)
        _add(tar, TEST_VECTORS, VECTORS)
    return path


def _written(destination: Path) -> list[str]:
    return sorted(str(p.relative_to(destination)) for p in destination.rglob("*") if p.is_file())


# GNU: member type "S"; pax: a regular member with a sparse map in its extended header
@pytest.mark.parametrize("tar_format", ["gnu", "pax"])
def test_a_sparse_member_declaring_far_more_than_it_stores_is_refused_before_anything_is_written(
        tmp_path: Path, tar_format: str) -> None:
    source = _source(tmp_path / "src")
    with (source / MODEL / str(VERSION) / "big.bin").open("wb") as f:
        f.truncate(SPARSE_BYTES)
    bundle = tmp_path / "sparse.tar"
    files = [f"{MODEL}/config.pbtxt", f"{MODEL}/{VERSION}/model.onnx", f"{MODEL}/{VERSION}/big.bin", TEST_VECTORS]
    subprocess.run(["tar", f"--format={tar_format}", "--sparse", "--no-recursion", "-cf", str(bundle), *files],
                   cwd=source, check=True)
    assert bundle.stat().st_size < SPARSE_BYTES // 100
    destination = tmp_path / "staging"
    destination.mkdir()
    with pytest.raises(UpdateRejected, match=rf"bundle member '{MODEL}/{VERSION}/big.bin' is a sparse file: "
                                             "only regular files are allowed"):
        extract_bundle(bundle, MODEL, VERSION, destination)
    assert _written(destination) == []


@pytest.mark.parametrize(("fields", "kind"), [
    ({"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}, "a link"),
    ({"type": tarfile.LNKTYPE, "linkname": f"{MODEL}/config.pbtxt"}, "a link"),
    ({"type": tarfile.DIRTYPE}, "a folder"),
    ({"type": tarfile.FIFOTYPE}, "of tar type b'6'"),
    ({"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, "of tar type b'3'"),
    ({"type": tarfile.CONTTYPE}, "of tar type b'7'"),
])
def test_members_other_than_regular_files_are_refused_before_anything_is_written(
        tmp_path: Path, fields: dict[str, object], kind: str) -> None:
    name = f"{MODEL}/{VERSION}/odd"
    bundle = _bundle(tmp_path, [(name, b"", fields)])
    destination = tmp_path / "staging"
    destination.mkdir()
    with pytest.raises(UpdateRejected, match=f"bundle member '{name}' is {kind}: only regular files"):
        extract_bundle(bundle, MODEL, VERSION, destination)
    assert _written(destination) == []


def test_a_header_declaring_more_than_the_archive_holds_names_the_member_and_the_limit(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    lying = tarfile.TarInfo(f"{MODEL}/{VERSION}/weights.bin")
    lying.size = 4 << 30
    with bundle.open("r+b") as f:  # a header put before the end-of-archive blocks, with none of its data
        with tarfile.open(fileobj=io.BytesIO(bundle.read_bytes())) as tar:
            end = tar.offset
        f.seek(end)
        f.write(lying.tobuf(format=tarfile.GNU_FORMAT) + b"\0" * 1024)
    destination = tmp_path / "staging"
    destination.mkdir()
    with pytest.raises(UpdateRejected) as refused:
        extract_bundle(bundle, MODEL, VERSION, destination)
    size = bundle.stat().st_size
    assert f"bundle member '{MODEL}/{VERSION}/weights.bin': declares {4 << 30} bytes, more than the " in \
        str(refused.value) and f"of the bundle's {size}" in str(refused.value), str(refused.value)
    assert _written(destination) == []


def test_members_are_copied_in_chunks_never_read_whole_into_memory(tmp_path: Path) -> None:
    weights = os.urandom(32 << 20)
    bundle = _bundle(tmp_path, [(f"{MODEL}/{VERSION}/weights.bin", weights, {})])
    destination = tmp_path / "staging"
    destination.mkdir()
    tracemalloc.start()
    try:
        vectors = extract_bundle(bundle, MODEL, VERSION, destination)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(vectors) == 1
    assert (destination / MODEL / str(VERSION) / "weights.bin").read_bytes() == weights
    assert peak < 4 * COPY_CHUNK_BYTES < len(weights) // 4, f"{peak} bytes allocated at the peak"
