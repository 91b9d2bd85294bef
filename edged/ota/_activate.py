"""Model activation: test a staged version privately, switch to it atomically, roll it back.

Invariants: the served repository only ever holds versions that passed their test vectors (staging happens in
a folder beside it, on the same filesystem so the switch is one rename); the previous version and its
config.pbtxt stay on disk until the new one is confirmed, so a rollback needs no download; the engine swaps
versions only once the new one is ready (`InferenceService.reload_model`), so requests in flight finish on the
old version and none sees the model missing.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

import numpy as np
import orjson

from edged.engine import InferenceService, InferRequest, InferResponse, ModelVersion
from edged.errors import DiskFull, EdgedError, UpdateRejected
from edged.ota._bundle import TestVector
from edged.ota._durable import fsync_dir, replace_dir, write_atomic
from edged.protocol.codec import decode_request
from edged.protocol.datatypes import numpy_for
from edged.repository import list_versions

log = logging.getLogger(__name__)
VECTOR_TIMEOUT_S = 60.0
DISK_MARGIN = 1 << 20  # what the state directory keeps free beside an update (state files, SQLite journals)
MANIFEST = ".files.json"  # in a model's backup: the per-model files served before the switch


def _model_files(folder: Path) -> list[Path]:
    """The per-model files of a model folder (config.pbtxt, labels): everything but the version folders."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def run_vectors(version: ModelVersion, vectors: list[TestVector]) -> None:
    """Every vector's outputs must match within its rtol/atol; the first mismatch is the refusal's reason."""
    name = version.config.name
    for index, vector in enumerate(vectors):
        try:
            decoded = decode_request(orjson.dumps(vector.inputs), None)
        except EdgedError as e:
            raise UpdateRejected(f"test vector {index}: the request is invalid: {e}") from e
        response = _infer(version, InferRequest(name, decoded.inputs, version.version_str))
        for expected in vector.outputs:
            _compare(index, expected, response, vector)


def _infer(version: ModelVersion, request: InferRequest) -> InferResponse:
    done = threading.Event()
    box: list[InferResponse | EdgedError] = []

    def finish(result: InferResponse | EdgedError) -> None:
        box.append(result)
        done.set()

    try:
        version.submit(request, finish, inline=True)
    except EdgedError as e:
        raise UpdateRejected(f"test vectors: the new version refused a request: {e}") from e
    if not done.wait(VECTOR_TIMEOUT_S):
        raise UpdateRejected(f"test vectors: no response within {VECTOR_TIMEOUT_S:.0f} s")
    result = box[0]
    if isinstance(result, EdgedError):
        raise UpdateRejected(f"test vectors: inference failed: {result}")
    return result


def _compare(index: int, expected: dict[str, object], response: InferResponse, vector: TestVector) -> None:
    name = str(expected.get("name", ""))
    actual = response.outputs.get(name)
    if actual is None:
        raise UpdateRejected(f"test vector {index}: output {name!r} missing (outputs: {sorted(response.outputs)})")
    try:
        want = np.asarray(expected["data"], dtype=numpy_for(str(expected["datatype"]), name))
        want = want.reshape([int(d) for d in expected["shape"]])  # type: ignore[attr-defined]
    except (KeyError, TypeError, ValueError, EdgedError) as e:
        raise UpdateRejected(f"test vector {index}: output {name!r} is not a valid tensor: {e}") from e
    if tuple(actual.shape) != tuple(want.shape):
        raise UpdateRejected(f"test vector {index}: output {name!r} has shape {list(actual.shape)}, "
                             f"expected {list(want.shape)}")
    if not np.allclose(actual, want, rtol=vector.rtol, atol=vector.atol):
        worst = float(np.max(np.abs(actual.astype(np.float64) - want.astype(np.float64))))
        raise UpdateRejected(f"test vector {index}: output {name!r} differs from the expected values by up to "
                             f"{worst:g} (rtol {vector.rtol:g}, atol {vector.atol:g})")


def check_disk(work_dir: Path, bundle_bytes: int, stored: int = 0) -> None:
    """Refuses before anything is written when the state directory cannot hold the bundle and its unpacked copy
    (the served repository, telemetry and the MQTT outbox share that filesystem: a full one hurts them all).
    ``stored``: what an interrupted attempt already wrote of the bundle."""
    work_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work_dir).free
    needed = max(0, 2 * bundle_bytes - stored) + DISK_MARGIN
    if free < needed:
        raise DiskFull(f"disk: the update needs {needed / 2**20:.1f} MiB free in {work_dir} (the bundle, "
                             f"its unpacked copy and {DISK_MARGIN // 2**20} MiB to spare), "
                             f"{free / 2**20:.1f} MiB are free")


def stage(service: InferenceService, staged_model: Path, model: str, version: int,
          vectors: list[TestVector]) -> None:
    """Load the staged version privately beside the served one, warm it up, run its vectors, unload it."""
    try:
        loaded = service.load_detached(model, staged_model, version)
    except EdgedError as e:
        raise UpdateRejected(f"the staged version does not load: {e}") from e
    try:
        run_vectors(loaded, vectors)
    finally:
        service.unload_detached(loaded)


class Activator:
    """Moves versions between the staging area and the served repository; remembers configs for rollback."""

    def __init__(self, service: InferenceService, repository: Path, backup_dir: Path) -> None:
        self.service = service
        self.repository = repository
        self.backup_dir = backup_dir

    def prepare(self, model: str) -> None:
        """Forget the files an earlier update saved: a rollback must restore the ones served just before this."""
        shutil.rmtree(self.backup_dir / model, ignore_errors=True)

    def switch(self, staged_model: Path, model: str, version: int) -> None:
        served = self.repository / model
        served.mkdir(parents=True, exist_ok=True)
        self._back_up(served, self.backup_dir / model)
        for extra in _model_files(staged_model):  # labels and other per-model files come with the config
            if extra.name != "config.pbtxt":
                write_atomic(served / extra.name, extra.read_bytes())
        if (served / str(version)).exists():
            shutil.rmtree(served / str(version))  # an earlier failed attempt: never served (reload below)
        replace_dir(staged_model / str(version), served / str(version))
        write_atomic(served / "config.pbtxt", (staged_model / "config.pbtxt").read_bytes())
        self.service.reload_model(model)

    @staticmethod
    def _back_up(served: Path, backup: Path) -> None:
        """Copy every per-model file (config.pbtxt, labels) before the first is overwritten. The manifest is
        written last: only a complete backup is ever restored, and an incomplete one means nothing was touched."""
        shutil.rmtree(backup, ignore_errors=True)
        backup.mkdir(parents=True)
        names = []
        for item in _model_files(served):
            write_atomic(backup / item.name, item.read_bytes())
            names.append(item.name)
        write_atomic(backup / MANIFEST, json.dumps(sorted(names)).encode())

    def roll_back(self, model: str, version: int) -> None:
        """Back to the previous version and config; the new version leaves the repository."""
        self.roll_back_files(model, version)
        self._reload_after_rollback(model)

    def roll_back_files(self, model: str, version: int) -> None:
        """The on-disk half of a rollback: before the engine starts, so an unconfirmed version never serves."""
        served = self.repository / model
        trash = self.backup_dir / f".{model}.{version}.removed"
        if (served / str(version)).exists():
            shutil.rmtree(trash, ignore_errors=True)
            replace_dir(served / str(version), trash)
        self._restore(served, self.backup_dir / model)
        if served.is_dir() and not list_versions(served):  # a model the device did not have before the update
            shutil.rmtree(served, ignore_errors=True)
            fsync_dir(self.repository)
        shutil.rmtree(trash, ignore_errors=True)

    @staticmethod
    def _restore(served: Path, backup: Path) -> None:
        """Per-model files as they were before the switch: changed ones restored, ones the update added removed."""
        manifest = backup / MANIFEST
        if not manifest.exists() or not served.is_dir():
            return
        kept = set(json.loads(manifest.read_text(encoding="utf-8")))
        for item in _model_files(served):
            if item.name not in kept:
                item.unlink()
        for name in sorted(kept):
            write_atomic(served / name, (backup / name).read_bytes())
        fsync_dir(served)

    def _reload_after_rollback(self, model: str) -> None:
        served = self.repository / model
        if served.is_dir() and list_versions(served):
            self.service.reload_model(model)
        else:  # a model the device did not have before the update (its folder went in roll_back_files)
            try:
                self.service.remove_model(model)
            except EdgedError as e:
                log.warning("model %s: unloading after rollback: %s", model, e)

    def prune(self, model: str, keep: int) -> list[int]:
        """Delete the oldest versions beyond ``keep``; returns the deleted numbers."""
        served = self.repository / model
        versions = list_versions(served)
        removed = versions[:-keep] if len(versions) > keep else []
        for number in removed:
            shutil.rmtree(served / str(number), ignore_errors=True)
        if removed:
            fsync_dir(served)
        return removed
