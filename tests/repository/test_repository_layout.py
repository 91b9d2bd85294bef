"""Repository layout on real temporary folders: models, versions, policies, runtimes, names, atomic install."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from edged.errors import ModelConfigError, ModelError
from edged.repository import (
    MAX_CONFIG_BYTES,
    changed_versions,
    check_model_name,
    detect_runtime,
    find_models,
    fingerprint,
    install_version,
    list_versions,
    load_model_config,
    missing_versions,
    select_versions,
    write_file_atomic,
)
from edged.repository.model_config import VersionPolicy


def make(root: Path, *paths: str) -> None:
    for rel in paths:
        target = root / rel
        if rel.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"x")


def test_find_models_lists_folders_and_skips_hidden_entries_and_files(tmp_path: Path) -> None:
    make(tmp_path, "b/", "a/1/", ".staging/", "README.md")
    assert find_models(tmp_path) == ["a", "b"]
    with pytest.raises(ModelError, match="cannot be listed"):
        find_models(tmp_path / "missing")


def test_list_versions_keeps_numeric_folders_and_logs_the_rest(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    make(tmp_path, "10/", "2/", "1/", "latest/", "007/", "3", ".install-4-abc/", "9223372036854775807/",
         "9223372036854775808/", "9999999999999999999/")
    with caplog.at_level(logging.INFO, logger="edged.repository.layout"):
        assert list_versions(tmp_path) == [1, 2, 10, 2**63 - 1]  # Triton's versions are int64
    assert "'latest'" in caplog.text and "'007'" in caplog.text
    assert "'9223372036854775808'" in caplog.text and "'9999999999999999999'" in caplog.text
    assert set(fingerprint(tmp_path)) == {"", "1", "2", "10", "9223372036854775807"}
    assert ".install" not in caplog.text


def test_version_policies_select_versions(caplog: pytest.LogCaptureFixture) -> None:
    available = [1, 2, 3, 7]
    assert select_versions(VersionPolicy(), available) == [7]
    assert select_versions(VersionPolicy("latest", num_versions=2), available) == [3, 7]
    assert select_versions(VersionPolicy("latest", num_versions=9), available) == available
    assert select_versions(VersionPolicy("all"), available) == available
    specific = VersionPolicy("specific", versions=(2, 5, 7))
    with caplog.at_level(logging.WARNING):
        assert select_versions(specific, available) == [2, 7]
    assert "[5]" in caplog.text
    assert missing_versions(specific, available) == [5]
    assert missing_versions(VersionPolicy(), available) == []


def test_detect_runtime_from_the_newest_version_with_a_model_file(tmp_path: Path) -> None:
    make(tmp_path, "1/model.onnx", "2/model.plan", "3/notes.txt")
    assert detect_runtime(tmp_path, [1, 2, 3]) == "tensorrt"
    assert detect_runtime(tmp_path, [1]) == "onnxruntime"
    make(tmp_path, "4/model.pt2")
    assert detect_runtime(tmp_path, [4]) == "pytorch"
    assert detect_runtime(tmp_path, [3]) is None


def test_load_model_config_names_the_model_after_its_folder(tmp_path: Path) -> None:
    model = tmp_path / "digits"
    model.mkdir()
    assert load_model_config(model) is None
    (model / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    config = load_model_config(model)
    assert config is not None and config.name == "digits"
    (model / "config.pbtxt").write_text('name: "other"\n')
    with pytest.raises(ModelConfigError, match="folder is 'digits'"):
        load_model_config(model)
    (model / "config.pbtxt").write_bytes(b'name: "\xff"')
    with pytest.raises(ModelConfigError, match="not UTF-8"):
        load_model_config(model)


def _load_in_thread(model: Path) -> BaseException | None:
    """load_model_config in a thread, waited for with a deadline: a read that blocks (a FIFO) must not hang the
    test run; it shows as the thread still alive."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            load_model_config(model)
            outcome.append(None)
        except BaseException as e:  # the test inspects what was raised
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), f"load_model_config({model}) is still blocked"
    return outcome[0]


def test_a_fifo_as_config_is_refused_without_blocking(tmp_path: Path) -> None:
    model = tmp_path / "fifo"
    model.mkdir()
    os.mkfifo(model / "config.pbtxt")
    error = _load_in_thread(model)
    assert isinstance(error, ModelConfigError), error
    assert str(error).startswith(f"{model / 'config.pbtxt'}: ") and "is not a regular file" in str(error)


def test_a_config_larger_than_the_cap_is_refused_naming_the_limit(tmp_path: Path) -> None:
    model = tmp_path / "big"
    model.mkdir()
    (model / "config.pbtxt").write_bytes(b"# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(ModelConfigError, match=f"config.pbtxt: .*larger than the limit of {MAX_CONFIG_BYTES} bytes"):
        load_model_config(model)
    (model / "config.pbtxt").write_bytes(b"# padding\n" * (MAX_CONFIG_BYTES // 20))
    assert load_model_config(model) is not None  # a large but allowed file is read whole


def test_a_config_linked_out_of_the_model_folder_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.pbtxt"
    secret.write_text('api_password: "hunter2"\n')
    leak, zero = tmp_path / "repo" / "leak", tmp_path / "repo" / "zero"
    leak.mkdir(parents=True)
    zero.mkdir()
    (leak / "config.pbtxt").symlink_to(secret)
    (zero / "config.pbtxt").symlink_to("/dev/zero")
    for model in (leak, zero):
        error = _load_in_thread(model)
        assert isinstance(error, ModelConfigError), error
        assert f"{model / 'config.pbtxt'}: " in str(error) and "leads outside the model folder" in str(error)
    (leak / "real.pbtxt").write_text('max_batch_size: 4\n')  # a link inside the folder is fine
    (leak / "config.pbtxt").unlink()
    (leak / "config.pbtxt").symlink_to("real.pbtxt")
    config = load_model_config(leak)
    assert config is not None and config.max_batch_size == 4


@pytest.mark.parametrize("name", ["", "a/b", "..", ".", ".hidden", "a\0b", "x" * 256, "a\\b"])
def test_unsafe_model_names_are_refused(name: str) -> None:
    with pytest.raises(ModelConfigError, match="expected a single path segment"):
        check_model_name(name)


def test_safe_model_names_pass() -> None:
    assert check_model_name("resnet50_v1.5-int8") == "resnet50_v1.5-int8"


def test_install_version_appears_complete_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    model = tmp_path / "m"

    def populate(folder: Path) -> None:
        (folder / "model.onnx").write_bytes(b"onnx")
        (folder / "sub").mkdir()
        (folder / "sub" / "extra.bin").write_bytes(b"1")

    target = install_version(model, 3, populate)
    assert target == model / "3"
    assert (target / "model.onnx").read_bytes() == b"onnx"
    assert list_versions(model) == [3]
    with pytest.raises(ModelError, match="already exists"):
        install_version(model, 3, populate)

    def broken(folder: Path) -> None:
        (folder / "model.onnx").write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        install_version(model, 4, broken)
    assert sorted(p.name for p in model.iterdir()) == ["3"]


def test_write_file_atomic_replaces_content_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    write_file_atomic(path, b"one")
    write_file_atomic(path, b"two")
    assert path.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["config.pbtxt"]


def test_fingerprints_name_the_changed_version_or_all_when_the_model_folder_changed(tmp_path: Path) -> None:
    for version in (1, 2):
        (tmp_path / str(version)).mkdir()
        (tmp_path / str(version) / "model.onnx").write_bytes(b"v%d" % version)
    (tmp_path / "config.pbtxt").write_text('name: "m"\n')
    before = fingerprint(tmp_path)
    (tmp_path / "2" / "model.onnx").write_bytes(b"version two, rewritten")
    (tmp_path / "2" / "model.onnx.swp").write_bytes(b"editor")
    (tmp_path / ".#config.pbtxt").write_bytes(b"emacs lock")
    assert changed_versions(before, fingerprint(tmp_path)) == {2}
    (tmp_path / "config.pbtxt").write_text('name: "m"\nmax_batch_size: 4\n')
    assert changed_versions(before, fingerprint(tmp_path)) is None


def test_a_folder_whose_name_is_not_utf8_is_skipped_and_handed_over_by_its_escaped_name(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Review: such a name (os.fsdecode's lone surrogates) reached the index, and orjson refused the document."""
    make(tmp_path, "good/1/model.onnx")
    os.makedirs(os.path.join(os.fsencode(tmp_path), b"cam\xff", b"1"))  # as bytes: the name is not UTF-8
    skipped: list[str] = []
    assert find_models(tmp_path, skipped.append) == ["good"]
    assert [os.fsencode(name) for name in skipped] == [b"cam\xff"]
    with caplog.at_level(logging.WARNING, logger="edged.repository.layout"):
        assert find_models(tmp_path) == ["good"]
    assert [r.getMessage() for r in caplog.records] == [
        "model repository: skipping the folder b'cam\\xff': its name is not UTF-8, so no request, status or index "
        "can name it; rename it (for example with convmv, or mv in a UTF-8 locale)"]
    with pytest.raises(ModelConfigError, match=r"is not UTF-8"):
        check_model_name(os.fsdecode(b"cam\xff"))
