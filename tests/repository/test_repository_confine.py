"""The resolver every config-named file goes through, on real folders and symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edged.errors import ModelConfigError
from edged.repository import confined_path, read_confined, with_confined_parameters
from edged.repository.model_config import ModelConfig


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "labels.txt").write_text("a\nb\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    return folder


def test_a_relative_engine_cache_becomes_its_absolute_path_inside_the_model_folder(model_dir: Path) -> None:
    config = ModelConfig(name="m", parameters={"trt_engine_cache_path": "cache", "other": "x"})
    resolved = with_confined_parameters(config, model_dir)
    assert resolved.parameters == {"trt_engine_cache_path": str(model_dir.resolve() / "cache"), "other": "x"}
    assert config.parameters["trt_engine_cache_path"] == "cache"  # what the API reports stays as given
    assert with_confined_parameters(ModelConfig(name="m"), model_dir) == ModelConfig(name="m")


def test_read_confined_reads_inside_and_refuses_a_file_later_replaced_by_a_symlink_out(model_dir: Path) -> None:
    assert read_confined(model_dir, "labels.txt", "label_filename") == b"a\nb\n"
    os.replace(model_dir / "labels.txt", model_dir / "old.txt")
    (model_dir / "labels.txt").symlink_to(model_dir.parent / "outside.txt")
    with pytest.raises(ModelConfigError, match=r"'labels\.txt' leads outside the model folder"):
        read_confined(model_dir, "labels.txt", "label_filename")


def test_a_dangling_symlink_pointing_out_is_refused_even_when_missing_files_are_allowed(model_dir: Path) -> None:
    (model_dir / "later.txt").symlink_to(model_dir.parent / "not-yet.txt")
    with pytest.raises(ModelConfigError, match="leads outside the model folder"):
        confined_path(model_dir, "later.txt", "label_filename", must_exist=False)
    assert confined_path(model_dir, "absent.txt", "label_filename", must_exist=False) == \
        model_dir.resolve() / "absent.txt"


def test_a_symlink_loop_and_a_nul_byte_are_refused_with_the_field_named(model_dir: Path) -> None:
    (model_dir / "loop").symlink_to("loop")
    with pytest.raises(ModelConfigError, match="label_filename 'loop' cannot be resolved"):
        confined_path(model_dir, "loop", "label_filename")
    with pytest.raises(ModelConfigError, match="is not a file name"):
        confined_path(model_dir, "a\0b", "label_filename")
