"""scripts/make_genai_model.py rebuilds the bundled tiny Llama byte for byte, and ONNX Runtime GenAI's export
computes what transformers computes on the same weights (torch, CPU, fp32)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from reference import og_greedy

pytest.importorskip("transformers")
og = pytest.importorskip("onnxruntime_genai")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "<|user|>Open the gate<|end|>\n<|assistant|>"
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    spec = importlib.util.spec_from_file_location("make_genai_model", ROOT / "scripts" / "make_genai_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_genai_model"] = module
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("genai")
    folder = module.build(out, keep_hf=out / "hf")
    yield folder / "1", out / "hf"
    sys.modules.pop("make_genai_model", None)


@pytest.mark.slow
def test_script_rebuilds_the_bundled_model(rebuilt: tuple[Path, Path]) -> None:
    bundled = ROOT / "models" / "tiny_llama" / "1"
    for name in ("model.onnx.data", "tokenizer.json", "chat_template.jinja", "genai_config.json"):
        assert (rebuilt[0] / name).read_bytes() == (bundled / name).read_bytes(), name


@pytest.mark.slow
def test_logits_and_greedy_tokens_match_transformers(rebuilt: tuple[Path, Path]) -> None:
    from transformers import LlamaForCausalLM

    version_dir, hf = rebuilt
    prompt_ids, new_ids, _ = og_greedy(version_dir, PROMPT, 12)
    reference = LlamaForCausalLM.from_pretrained(str(hf)).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([prompt_ids])).logits[0, -1].numpy()
    model = og.Model(str(version_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt_ids) + 1, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt_ids)
    logits = np.asarray(generator.get_logits()).reshape(-1)[-expected.size:]
    np.testing.assert_allclose(logits, expected, atol=TOLERANCE)
    top2 = np.sort(expected)[-2:]
    assert top2[1] - top2[0] > TOLERANCE  # so greedy decoding must agree on the first token at least
    with torch.no_grad():
        generated = reference.generate(torch.tensor([prompt_ids]), max_new_tokens=12, do_sample=False)
    assert generated[0, len(prompt_ids):].tolist()[:len(new_ids)] == new_ids
