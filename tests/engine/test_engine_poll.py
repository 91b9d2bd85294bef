"""Poll mode reloads what changed and only once it is complete: hidden files and editors' or copiers'
temporaries reload nothing, a file still being written is waited for, and a change to one version reloads that
version only (the other version's instance is the same object afterwards)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_fakes import BACKENDS
from modelgen import add_custom_model, add_model, mlp_reference, mlp_weights, write_mlp_onnx

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest

CONFIG = 'name: "multi"\nplatform: "onnxruntime_onnx"\nversion_policy: { all: {} }\n'
TEMPORARIES = (".hidden", "model.onnx~", ".#model.onnx", ".model.onnx.swp", "model.onnx.swp", "copy.tmp",
               "model.onnx.part", "#model.onnx#")


def _weights(seed: int) -> list[np.ndarray]:
    return mlp_weights(in_dim=4, hidden=8, out_dim=2, seed=seed)


@pytest.fixture
def service(tmp_path: Path) -> InferenceService:
    add_model(tmp_path, "multi", CONFIG, {1: _weights(1), 2: _weights(2)})
    running = InferenceService(tmp_path, ModelsConfig(control_mode="poll"))
    running.start()
    yield running  # type: ignore[misc]
    running.close()


def _versions(service: InferenceService) -> dict[int, object]:
    return dict(service.record_for("multi").versions)


def _answer(service: InferenceService, version: str) -> np.ndarray:
    x = np.ones((1, 4), np.float32)
    return service.infer(InferRequest("multi", {"input": x}, version=version)).outputs["output"]


def _settled_poll(service: InferenceService) -> None:
    service.poll()
    service.poll()


@pytest.mark.parametrize("name", TEMPORARIES)
def test_hidden_and_temporary_files_reload_nothing(service: InferenceService, tmp_path: Path, name: str) -> None:
    before = _versions(service)
    instances = [v.instances[0] for v in service.record_for("multi").versions.values()]
    (tmp_path / "multi" / name).write_bytes(b"editor state")
    (tmp_path / "multi" / "1" / name).write_bytes(b"partial copy")
    _settled_poll(service)
    after = _versions(service)
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    assert [v.instances[0] for v in service.record_for("multi").versions.values()] == instances


def test_a_changed_version_reloads_alone(service: InferenceService, tmp_path: Path) -> None:
    before = _versions(service)
    untouched_instance = service.record_for("multi").versions[1].instances[0]
    write_mlp_onnx(tmp_path / "multi" / "2" / "model.onnx", _weights(22))
    _settled_poll(service)
    after = _versions(service)
    assert after[1] is before[1], "version 1 did not change and must not reload"
    assert service.record_for("multi").versions[1].instances[0] is untouched_instance
    assert after[2] is not before[2]
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(_answer(service, "2"), mlp_reference(_weights(22), x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_answer(service, "1"), mlp_reference(_weights(1), x), rtol=1e-4, atol=1e-5)


def test_a_file_still_being_written_is_loaded_once_it_settles(service: InferenceService, tmp_path: Path) -> None:
    staging = tmp_path / "staging.onnx"
    write_mlp_onnx(staging, _weights(3))
    data = staging.read_bytes()
    target = tmp_path / "multi" / "3" / "model.onnx"
    target.parent.mkdir()
    target.write_bytes(data[: len(data) // 2])
    service.poll()
    with target.open("ab") as handle:  # the copy goes on between two polls
        handle.write(data[len(data) // 2:])
    service.poll()
    states = {e["version"]: e["state"] for e in service.repository_index() if e["name"] == "multi"}
    assert "3" not in states, f"a file still changing must not be loaded yet (index: {states})"
    service.poll()  # unchanged since the last poll: complete
    assert service.model_ready("multi", "3")
    x = np.ones((1, 4), np.float32)
    np.testing.assert_allclose(_answer(service, "3"), mlp_reference(_weights(3), x), rtol=1e-4, atol=1e-5)


def _add_crashing_model(repo: Path, name: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model").write_bytes(b"test backend model\n")
    # no inputs and outputs: the load asks the backend to describe the file, and the crashing backend raises
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "crashing"\nmax_batch_size: 8\n')


def test_an_unexpected_error_in_one_models_load_stops_neither_the_start_nor_the_poll(tmp_path: Path) -> None:
    add_custom_model(tmp_path, "aa", "doubling")
    _add_crashing_model(tmp_path, "bad1")
    add_custom_model(tmp_path, "zz1", "doubling")
    service = InferenceService(tmp_path, ModelsConfig(control_mode="poll", backends=BACKENDS, warmup=False))
    try:
        service.start()  # before: the RuntimeError went through start(), and zz1 was never loaded
        assert service.model_ready("aa") and service.model_ready("zz1")
        _add_crashing_model(tmp_path, "bad2")
        add_custom_model(tmp_path, "zz2", "doubling")
        service.poll(settle=False)  # before: the poll stopped at bad2, so zz2 (sorted after it) never loaded
        assert service.model_ready("zz2")
        reasons = {entry["name"]: entry["reason"] for entry in service.repository_index()}
        for name in ("bad1", "bad2"):
            assert reasons[name].startswith(f"model {name}: load failed on an unexpected RuntimeError: simulated "
                                            "runtime bug describing model"), reasons
        service.poll(settle=False)  # a failed model is retried when its files change, not on every poll
        assert not service.model_ready("bad2")
    finally:
        service.close()
