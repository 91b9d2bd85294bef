"""The engine on real ONNX Runtime and PyTorch models: loading, metadata, inference, validation, versions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from modelgen import BUNDLED_MODELS, add_model, mlp_reference, mlp_weights

from edged.config import ModelsConfig
from edged.engine import InferenceService, InferRequest, ModelState, RequestedOutput
from edged.errors import InvalidInput, ModelNotFound, ModelNotReady, PayloadTooLarge, Unavailable


@pytest.fixture(scope="module")
def bundled() -> InferenceService:
    service = InferenceService(BUNDLED_MODELS, ModelsConfig())
    service.start()
    yield service
    service.close()


def test_bundled_models_are_ready_and_indexed(bundled: InferenceService) -> None:
    index = {entry["name"]: entry for entry in bundled.repository_index()}
    assert {"digits_onnx", "digits_torch", "tiny_mlp"} <= set(index)
    assert all(index[name]["state"] == "READY" for name in ("digits_onnx", "digits_torch", "tiny_mlp"))
    assert bundled.ready


def test_metadata_has_full_shapes_and_kserve_datatypes(bundled: InferenceService) -> None:
    metadata = bundled.model_metadata("tiny_mlp")
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert metadata["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 10]}]


def test_onnx_and_torchscript_exports_of_the_digit_classifier_agree(bundled: InferenceService) -> None:
    x = np.random.default_rng(1).random((5, 64), dtype=np.float32)
    onnx_out = bundled.infer(InferRequest("digits_onnx", {"input": x})).outputs["output"]
    torch_out = bundled.infer(InferRequest("digits_torch", {"INPUT__0": x})).outputs["OUTPUT__0"]
    np.testing.assert_allclose(onnx_out, torch_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(onnx_out.sum(axis=1), np.ones(5), rtol=1e-5)


def test_digit_classifier_recognises_held_out_digits(bundled: InferenceService) -> None:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    _, x_test, _, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0, stratify=digits.target)
    predicted = []
    for start in range(0, len(x_test), 64):
        out = bundled.infer(InferRequest("digits_onnx", {"input": x_test[start:start + 64]})).outputs["output"]
        predicted.append(out.argmax(axis=1))
    accuracy = float((np.concatenate(predicted) == y_test).mean())
    assert accuracy >= 0.95


def test_requested_outputs_and_request_id_are_echoed(bundled: InferenceService) -> None:
    x = np.zeros((1, 64), np.float32)
    response = bundled.infer(InferRequest("tiny_mlp", {"input": x}, id="req-7", outputs=(RequestedOutput("output"),)))
    assert response.id == "req-7" and response.version == "1" and list(response.outputs) == ["output"]


@pytest.mark.parametrize(("inputs", "fragment"), [
    ({}, "expected input 'input' is missing"),
    ({"input": np.zeros((1, 64), np.float64)}, "has datatype FP64, expected FP32"),
    ({"input": np.zeros((1, 63), np.float32)}, "has shape [1, 63], expected [-1, 64]"),
    ({"input": np.zeros((65, 64), np.float32)}, "batch size 65, expected 1 to 64"),
    ({"input": np.zeros((1, 64), np.float32), "extra": np.zeros(1, np.float32)}, "unexpected input 'extra'"),
])
def test_invalid_requests_name_the_model_tensor_and_expectation(bundled: InferenceService, inputs: dict,
                                                                 fragment: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        bundled.infer(InferRequest("tiny_mlp", inputs))
    assert fragment in str(caught.value) and "tiny_mlp" in str(caught.value)


def test_unknown_output_and_model_and_version_are_refused(bundled: InferenceService) -> None:
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(InvalidInput, match="unknown requested output 'nope'"):
        bundled.infer(InferRequest("tiny_mlp", {"input": x}, outputs=(RequestedOutput("nope"),)))
    with pytest.raises(ModelNotFound, match="unknown model"):
        bundled.infer(InferRequest("no_such_model", {"input": x}))
    with pytest.raises(ModelNotFound, match="has no version 9"):
        bundled.infer(InferRequest("tiny_mlp", {"input": x}, version="9"))


@pytest.mark.parametrize("version", ["01", " 1", "1_0", "+1", "\u0661", "9223372036854775808", "1" * 5000])
def test_a_version_is_named_as_its_folder_is_without_leading_zeros_or_other_forms(bundled: InferenceService,
                                                                                  version: str) -> None:
    x = np.zeros((1, 64), np.float32)
    assert bundled.infer(InferRequest("tiny_mlp", {"input": x}, version="1")).version == "1"
    with pytest.raises(ModelNotFound, match="is not a version number"):  # before: '01', ' 1', '\u0661' reached 1
        bundled.infer(InferRequest("tiny_mlp", {"input": x}, version=version))


def test_element_limit_is_enforced(tmp_path: Path) -> None:
    add_model(tmp_path, "mlp", None, {1: mlp_weights()})
    service = InferenceService(tmp_path, ModelsConfig(), max_elements=100)
    service.start()
    try:
        with pytest.raises(PayloadTooLarge, match="more than the limit of 100"):
            service.infer(InferRequest("mlp", {"input": np.zeros((2, 64), np.float32)}))
    finally:
        service.close()


def test_config_is_autocompleted_from_the_onnx_file(tmp_path: Path) -> None:
    weights = mlp_weights(in_dim=8, hidden=16, out_dim=3)
    add_model(tmp_path, "bare", None, {1: weights})
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        config = service.model_config("bare")
        assert config.max_batch_size == 4 and config.dynamic_batching is not None
        assert [(t.name, t.data_type, t.dims) for t in config.input] == [("input", "TYPE_FP32", (8,))]
        x = np.random.default_rng(0).random((3, 8), dtype=np.float32)
        out = service.infer(InferRequest("bare", {"input": x})).outputs["output"]
        np.testing.assert_allclose(out, mlp_reference(weights, x), rtol=1e-5, atol=1e-6)
    finally:
        service.close()


def test_nonfinite_inputs_are_refused_when_the_model_says_so(tmp_path: Path) -> None:
    config = ('name: "strict"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
              'parameters { key: "reject_nonfinite_inputs" value: { string_value: "true" } }\n')
    add_model(tmp_path, "strict", config, {1: mlp_weights(in_dim=4, hidden=4, out_dim=2)})
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        x = np.array([[1.0, np.nan, 0.0, 0.0]], np.float32)
        with pytest.raises(InvalidInput, match="NaN or Inf"):
            service.infer(InferRequest("strict", {"input": x}))
    finally:
        service.close()


def test_version_policy_serves_the_latest_two_and_answers_for_each(tmp_path: Path) -> None:
    config = 'name: "multi"\nplatform: "onnxruntime_onnx"\nversion_policy: { latest: { num_versions: 2 } }\n'
    add_model(tmp_path, "multi", config, {v: mlp_weights(in_dim=4, hidden=4, out_dim=2, seed=v) for v in (1, 2, 3)})
    (tmp_path / "multi" / "notes").mkdir()  # non-numeric folders are ignored
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        assert [e["version"] for e in service.repository_index()] == ["2", "3"]
        x = np.ones((1, 4), np.float32)
        v2 = service.infer(InferRequest("multi", {"input": x}, version="2")).outputs["output"]
        latest = service.infer(InferRequest("multi", {"input": x}))
        assert latest.version == "3"
        np.testing.assert_allclose(v2, mlp_reference(mlp_weights(4, 4, 2, seed=2), x), rtol=1e-5, atol=1e-6)
        with pytest.raises(ModelNotFound, match="has no version 1"):
            service.infer(InferRequest("multi", {"input": x}, version="1"))
    finally:
        service.close()


def test_explicit_mode_loads_unloads_and_refuses_in_other_modes(tmp_path: Path) -> None:
    add_model(tmp_path, "mlp", None, {1: mlp_weights()})
    service = InferenceService(tmp_path, ModelsConfig(control_mode="explicit"))
    service.start()
    try:
        assert service.repository_index() == [{"name": "mlp", "version": "", "state": "", "reason": ""}]
        service.load_model("mlp")
        assert service.model_ready("mlp")
        service.unload_model("mlp")
        assert not service.model_ready("mlp")
        with pytest.raises(ModelNotFound):
            service.infer(InferRequest("mlp", {"input": np.zeros((1, 64), np.float32)}))
    finally:
        service.close()
    fixed = InferenceService(tmp_path, ModelsConfig(control_mode="none"))
    fixed.start()
    try:
        with pytest.raises(Unavailable, match="not allowed in model control mode 'none'"):
            fixed.unload_model("mlp")
    finally:
        fixed.close()


def test_poll_loads_new_models_keeps_serving_on_a_broken_reload_and_unloads_removed(tmp_path: Path) -> None:
    add_model(tmp_path, "a", None, {1: mlp_weights(in_dim=4, hidden=4, out_dim=2)})
    service = InferenceService(tmp_path, ModelsConfig(control_mode="poll"))
    service.start()
    try:
        add_model(tmp_path, "b", None, {1: mlp_weights(in_dim=4, hidden=4, out_dim=2)})
        service.poll()  # a change is acted on once two polls in a row see the same files (settled)
        assert not service.model_ready("b")
        service.poll()
        assert service.model_ready("b")
        (tmp_path / "a" / "config.pbtxt").write_text("max_batch_size: [oops")
        service.poll()
        service.poll()
        assert service.model_ready("a"), "a failed reload must keep the old version serving"
        service.infer(InferRequest("a", {"input": np.zeros((1, 4), np.float32)}))
        import shutil
        shutil.rmtree(tmp_path / "b")
        service.poll()
        assert not service.model_ready("b")
    finally:
        service.close()


def test_a_model_that_fails_to_load_is_reported_with_its_reason(tmp_path: Path) -> None:
    folder = tmp_path / "broken" / "1"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"not a protobuf at all")
    add_model(tmp_path, "good", None, {1: mlp_weights(in_dim=4, hidden=4, out_dim=2)})
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        index = {e["name"]: e for e in service.repository_index()}
        assert index["good"]["state"] == "READY"
        assert index["broken"]["state"] == "UNAVAILABLE" and "broken" in index["broken"]["reason"]
        with pytest.raises(ModelNotReady):
            service.infer(InferRequest("broken", {"input": np.zeros((1, 4), np.float32)}))
    finally:
        service.close()


def test_lazy_loading_loads_on_first_request(tmp_path: Path) -> None:
    add_model(tmp_path, "lazy", None, {1: mlp_weights(in_dim=4, hidden=4, out_dim=2)})
    service = InferenceService(tmp_path, ModelsConfig(load="lazy"))
    service.start()
    try:
        assert service.needs_load("lazy") and service.loaded_versions() == []
        service.infer(InferRequest("lazy", {"input": np.zeros((1, 4), np.float32)}))
        assert not service.needs_load("lazy")
        assert service.version_info("lazy").state is ModelState.READY
    finally:
        service.close()


def test_statistics_follow_tritons_fields(bundled: InferenceService) -> None:
    bundled.infer(InferRequest("tiny_mlp", {"input": np.zeros((2, 64), np.float32)}))
    stats = bundled.statistics("tiny_mlp")["model_stats"][0]
    assert stats["name"] == "tiny_mlp" and stats["version"] == "1"
    assert stats["inference_count"] >= 2 and stats["execution_count"] >= 1
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        assert set(stats["inference_stats"][key]) == {"count", "ns"}
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert any(b["batch_size"] == 2 for b in stats["batch_stats"])


def test_classification_extension_returns_top_k_with_labels(bundled: InferenceService) -> None:
    x = np.random.default_rng(3).random((2, 64), dtype=np.float32)
    scores = bundled.infer(InferRequest("digits_onnx", {"input": x})).outputs["output"]
    response = bundled.infer(InferRequest("digits_onnx", {"input": x},
                                          outputs=(RequestedOutput("output", class_count=3),)))
    top = response.outputs["output"]
    assert top.shape == (2, 3) and top.dtype == object
    for row in range(2):
        best = int(np.argmax(scores[row]))
        score, index, label = top[row, 0].decode().split(":")
        assert int(index) == best and label == str(best)  # labels.txt holds the digit names
        assert abs(float(score) - float(scores[row, best])) < 1e-5


def test_a_stateful_or_ensemble_model_is_refused_at_load_naming_the_field(tmp_path: Path) -> None:
    weights = mlp_weights(in_dim=4, hidden=4, out_dim=2)
    add_model(tmp_path, "stateful", 'name: "stateful"\nmax_batch_size: 4\nsequence_batching { }\n', {1: weights})
    add_model(tmp_path, "plain", None, {1: weights})
    service = InferenceService(tmp_path, ModelsConfig())
    service.start()
    try:
        index = {e["name"]: e for e in service.repository_index()}
        assert index["plain"]["state"] == "READY"
        assert index["stateful"]["state"] == "UNAVAILABLE"
        assert "config.pbtxt:3:1: field 'sequence_batching'" in index["stateful"]["reason"]
        with pytest.raises(ModelNotReady):
            service.infer(InferRequest("stateful", {"input": np.zeros((1, 4), np.float32)}))
    finally:
        service.close()
