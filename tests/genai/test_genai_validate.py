"""``edged models validate`` on a generative model folder: what ORT GenAI needs is there, the limits parse, the
chat template compiles, and the memory it will be charged is reported; each defect named."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from edged.cli.main import main

CONFIG = 'name: "gen"\nbackend: "onnxruntime_genai"\n'


def _folder(tmp_path: Path, model_dir: Path, config: str | None = CONFIG) -> Path:
    folder = tmp_path / "gen"
    shutil.copytree(model_dir, folder / "1")
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    return folder


def _validate(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["models", "validate", str(folder)])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_bundled_model_is_valid_and_its_memory_reported(tmp_path: Path, model_dir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path, model_dir, CONFIG + 'parameters { key: "max_sequences" value: { string_value: "4" } }')
    status, out, _ = _validate(folder, capsys)
    assert status == 0
    assert "note: generative model: 0.5 MiB of weights; KV cache 0.5 MiB for max_sequences 4 x max_length 256" in out
    assert "ok: model 'gen' is valid" in out


def test_a_folder_without_config_is_recognised_as_generative(tmp_path: Path, model_dir: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _validate(_folder(tmp_path, model_dir, None), capsys)
    assert status == 0
    assert '"backend": "onnxruntime_genai"' in out and "generative model" in out


def _drop_tokenizer(folder: Path) -> None:
    (folder / "1" / "tokenizer.json").unlink()


def _break_template(folder: Path) -> None:
    (folder / "1" / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }")


def _escape_decoder(folder: Path) -> None:
    path = folder / "1" / "genai_config.json"
    doc = json.loads(path.read_text())
    doc["model"]["decoder"]["filename"] = "../../outside.onnx"
    path.write_text(json.dumps(doc))


def _drop_heads(folder: Path) -> None:
    path = folder / "1" / "genai_config.json"
    doc = json.loads(path.read_text())
    del doc["model"]["decoder"]["head_size"]
    path.write_text(json.dumps(doc))


def _bad_limit(folder: Path) -> None:
    limit = 'parameters { key: "max_output_tokens" value: { string_value: "x" } }'
    (folder / "config.pbtxt").write_text(CONFIG + limit)


@pytest.mark.parametrize(("damage", "words"), [
    (_drop_tokenizer, "no tokenizer in"),
    (_break_template, "chat template"),
    (_escape_decoder, "model.decoder.filename '../../outside.onnx' leads outside"),
    (_drop_heads, "needs positive integers for head_size (found None)"),
    (_bad_limit, "parameter max_output_tokens must be a positive integer, found 'x'"),
])
def test_each_defect_is_named(damage: Callable[[Path], None], words: str, tmp_path: Path, model_dir: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path, model_dir)
    damage(folder)
    status, _, err = _validate(folder, capsys)
    assert status == 1
    assert words in err
