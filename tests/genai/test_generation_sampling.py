"""Sampling options as ONNX Runtime GenAI takes them: top_k's default is the whole vocabulary (the runtime refuses
a top_k past it), and OpenAI's 64-bit seeds are folded into the runtime's int32. A real InferenceService over the
bundled tiny Llama given a context (1024) longer than its vocabulary (320), as small models have."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from edged.backends.genai import fold_seed
from edged.config import ModelsConfig
from edged.engine import InferenceService
from edged.engine.generation import GenerationRequest
from edged.engine.generation_stream import Finished, GenerationEvent, TextDelta

PROMPT = "Once upon a time"
CONTEXT = 1024


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[InferenceService]:
    pytest.importorskip("onnxruntime_genai")
    folder = tmp_path_factory.mktemp("sampling") / "models" / "tiny_llama"
    shutil.copytree(model_dir, folder / "1")
    config = json.loads((folder / "1" / "genai_config.json").read_text())
    assert config["model"]["vocab_size"] < CONTEXT
    config["model"]["context_length"] = config["search"]["max_length"] = CONTEXT
    (folder / "1" / "genai_config.json").write_text(json.dumps(config))
    (folder / "config.pbtxt").write_text('name: "tiny_llama"\nbackend: "onnxruntime_genai"\n')
    running = InferenceService(folder.parent, ModelsConfig(control_mode="none"))
    running.start()
    yield running
    running.close()


def _events(service: InferenceService, **sampling: object) -> list[GenerationEvent]:
    request = GenerationRequest("tiny_llama", prompt=PROMPT, max_tokens=8, **sampling)  # type: ignore[arg-type]
    return list(service.generation.submit(request))


def _text(events: list[GenerationEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_sampling_without_top_k_takes_the_whole_vocabulary(service: InferenceService) -> None:
    # the default was the context length (1024): ORT GenAI refused it past the vocabulary, every sampled request
    default = _events(service, temperature=1.0, seed=7)
    assert isinstance(default[-1], Finished) and default[-1].usage.completion_tokens > 0
    whole = _events(service, temperature=1.0, seed=7, top_k=320)
    assert _text(default) == _text(whole), "no top_k is no truncation: the same tokens as top_k = the vocabulary"
    beyond = _events(service, temperature=1.0, seed=7, top_k=5000)
    assert _text(beyond) == _text(whole), "a top_k past the vocabulary truncates nothing"


def test_a_64_bit_seed_samples_and_is_repeatable(service: InferenceService) -> None:
    for seed in (2**31, 2**63 - 1, 2**64 - 1, -(2**63)):
        first = _events(service, temperature=1.0, seed=seed)
        assert isinstance(first[-1], Finished), first[-1]
        assert _text(_events(service, temperature=1.0, seed=seed)) == _text(first)


def test_seeds_fold_into_the_runtimes_int32_keeping_small_ones() -> None:
    assert [fold_seed(s) for s in (0, 1, 2**31 - 1)] == [0, 1, 2**31 - 1]
    big = [fold_seed(s) for s in (2**31, 2**32, 2**63 - 1, 2**64 - 1, -(2**63), -2)]
    assert all(0 <= s < 2**31 - 1 for s in big)
    assert len(set(big)) == len(big), "distinct large seeds stay distinct"
    assert fold_seed(-1) == fold_seed(2**64 - 1), "a negative seed is its 64-bit two's complement"



def test_top_p_zero_keeps_only_the_most_likely_token(service: InferenceService) -> None:
    # OpenAI's top_p 0; ORT GenAI took 0 as "no cut" and sampled the whole distribution
    greedy = _text(_events(service, temperature=0))
    assert all(_text(_events(service, temperature=1.0, top_p=0.0, seed=seed)) == greedy for seed in (1, 2, 3))
