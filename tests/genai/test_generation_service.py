"""The engine's `GenerationService` without any transport: the same tokens as ORT GenAI's own loop, read from a
thread and from an event loop; a cancelled stream stops its generator and ends with ``Finished("cancelled")``."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from reference import og_greedy  # tests/genai/reference.py

from edged.config import ModelsConfig
from edged.engine import InferenceService
from edged.engine.generation import GenerationRequest
from edged.engine.generation_stream import Finished, GenerationEvent, Started, TextDelta
from edged.errors import InvalidParameter, ModelNotFound

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def service(model_dir: Path) -> Iterator[InferenceService]:
    pytest.importorskip("onnxruntime_genai")
    repository = Path(tempfile.mkdtemp(prefix="edged-gen-"))
    (repository / "tiny_llama").symlink_to(model_dir.parent)
    running = InferenceService(repository, ModelsConfig())
    running.start()
    yield running
    running.close()


def _greedy(tokens: int) -> GenerationRequest:
    return GenerationRequest("tiny_llama", prompt=PROMPT, max_tokens=tokens, temperature=0)


def test_a_thread_reads_the_tokens_og_generates(service: InferenceService, model_dir: Path) -> None:
    ids, new, text = og_greedy(model_dir, PROMPT, 24)
    events = list(service.generation.submit(_greedy(24)))
    assert events[0] == Started(len(ids))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == text
    last = events[-1]
    assert isinstance(last, Finished)
    assert last.usage.prompt_tokens == len(ids)
    assert last.usage.completion_tokens == len(new) + (len(new) < 24)  # the end-of-sequence token is generated


def test_an_event_loop_reads_the_same_events(service: InferenceService) -> None:
    from_thread = list(service.generation.submit(_greedy(16)))

    async def read() -> list[GenerationEvent]:
        return [event async for event in service.generation.submit(_greedy(16)).events()]
    from_loop = asyncio.run(read())
    assert "".join(e.text for e in from_loop if isinstance(e, TextDelta)) == \
        "".join(e.text for e in from_thread if isinstance(e, TextDelta))
    assert from_loop[-1] == from_thread[-1]


def test_a_cancelled_stream_stops_before_its_next_token(service: InferenceService) -> None:
    # Cancelled at once, not at the first delta read: the 200 tokens take ~20 ms, and a CI run whose reading
    # thread was off the cores that long saw the generation finish ("length") before its cancel was read. The
    # stream still ends with "cancelled" from wherever the generation had got to.
    stream = service.generation.submit(GenerationRequest("tiny_llama", prompt=PROMPT, max_tokens=200,
                                                         temperature=1.0, seed=3))
    stream.cancel()
    seen: list[GenerationEvent] = list(stream)
    last = seen[-1]
    assert isinstance(last, Finished) and last.reason == "cancelled"
    assert last.usage.completion_tokens < 200


def test_stop_strings_never_reach_the_consumer(service: InferenceService) -> None:
    whole = "".join(e.text for e in service.generation.submit(_greedy(40)) if isinstance(e, TextDelta))
    stop = whole[len(whole) // 2:len(whole) // 2 + 2]
    request = GenerationRequest("tiny_llama", prompt=PROMPT, max_tokens=40, temperature=0, stop=(stop,))
    events = list(service.generation.submit(request))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == whole[:whole.find(stop)]
    assert isinstance(events[-1], Finished) and events[-1].reason == "stop"


def test_errors_are_raised_to_the_consumer(service: InferenceService) -> None:
    with pytest.raises(ModelNotFound, match="'nope' is not in the repository"):
        service.generation.submit(GenerationRequest("nope", prompt=PROMPT))
    with pytest.raises(InvalidParameter, match="max_tokens 100000 does not fit") as refused:
        list(service.generation.submit(GenerationRequest("tiny_llama", prompt=PROMPT, max_tokens=100000)))
    assert refused.value.param == "max_tokens"


def test_warm_up_generated_tokens_before_the_model_served(service: InferenceService) -> None:
    details = service.version_info("tiny_llama").instances[0].info.details
    assert details["warmup_tokens"] == 2
    assert details["max_sequences"] == 1


def test_a_model_unloaded_after_the_index_was_read_is_left_out_of_the_listing(model_dir: Path) -> None:
    # GET /v1/models reads the index without the registry lock, then looks each model up: a model unloaded
    # between the two was a ModelNotFound for the whole listing (a 500); the interleaving, made deterministic
    repository = Path(tempfile.mkdtemp(prefix="edged-gen-"))
    (repository / "tiny_llama").symlink_to(model_dir.parent)
    running = InferenceService(repository, ModelsConfig(control_mode="explicit", startup_models=("tiny_llama",)))
    running.start()
    try:
        before = running.repository_index(ready_only=True)
        assert list(running.generation.ready_generative(before)) == ["tiny_llama"]
        running.unload_model("tiny_llama")
        assert running.generation.ready_generative(before) == {}
        assert running.generation.generative_models() == []
        running.load_model("tiny_llama")
        assert running.generation.generative_models() == ["tiny_llama"]
        twice = before + before  # one entry per ready version: a model with two is listed once
        assert list(running.generation.ready_generative(twice)) == ["tiny_llama"]
    finally:
        running.close()
