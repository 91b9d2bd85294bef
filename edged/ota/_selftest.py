"""The self-test a new daemon release must pass before it is kept: every model it serves answers.

A version that came by OTA answers its own test vectors (kept beside the OTA state when it was staged, so they
outlive the bundle); any other version answers its warm-up inputs (the config's ``model_warmup``, or made-up
zeros), which proves it runs, not that its numbers are right. A model that failed to load fails the test; one
that is simply not loaded (explicit control mode) is not tested. The result is a report, not an exception:
``edged-update`` reads it over the socket and rolls the release back when ``ok`` is false.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from edged.engine import InferenceService, InferRequest, ModelVersion
from edged.engine.warmup import warmup_samples
from edged.errors import EdgedError
from edged.ota._activate import _infer as infer_one
from edged.ota._activate import run_vectors
from edged.ota._bundle import TestVector, parse_vectors
from edged.ota._durable import write_atomic


def vectors_file(work_dir: Path, model: str, version: int) -> Path:
    return work_dir / "vectors" / f"{model}.{version}.json"


def save_vectors(work_dir: Path, model: str, version: int, vectors: list[TestVector]) -> None:
    write_atomic(vectors_file(work_dir, model, version), json.dumps([asdict(v) for v in vectors]).encode())


def self_test(service: InferenceService, work_dir: Path) -> dict[str, Any]:
    results: dict[str, str] = {}
    for entry in service.repository_index():
        name, version, state = str(entry["name"]), str(entry["version"]), str(entry["state"])
        key = f"{name}/{version}" if version else name
        if state == "READY":
            results[key] = _answer(service.version_info(name, version), work_dir)
        elif state == "UNAVAILABLE" and entry.get("reason"):
            results[key] = f"failed: not loaded: {entry['reason']}"
    return {"ok": all(r.startswith("ok") for r in results.values()), "models": results}


def _answer(version: ModelVersion, work_dir: Path) -> str:
    name = version.config.name
    vectors = vectors_file(work_dir, name, version.version)
    try:
        if vectors.is_file():
            run_vectors(version, parse_vectors(vectors.read_bytes()))
            return "ok: its test vectors match"
        answered = 0
        for inputs, _ in warmup_samples(version.config, version.model_dir, version.max_elements):
            infer_one(version, InferRequest(name, inputs, version.version_str))
            answered += 1
    except (EdgedError, OSError) as e:
        return f"failed: {e}"
    return "ok: its warm-up answered" if answered else "ok: ready (no warm-up input can be made up)"
