"""Per-model generation limits from config.pbtxt parameters, and the KV cache in the memory budget: a real
InferenceService over a repository holding the bundled tiny Llama with a config.pbtxt of the test's."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from reference import og_greedy  # tests/genai/reference.py

from edged.backends.genai_config import generation_limits, kv_cache_bytes, read_decoder_shape
from edged.config import MemoryConfig, ModelsConfig
from edged.engine import InferenceService
from edged.engine.generation import GenerationRequest
from edged.engine.generation_gate import SequenceGate
from edged.engine.generation_stream import Finished, GenerationEvent, TextDelta
from edged.engine.memory_governor import MemoryGovernor
from edged.errors import ConfigError, InvalidParameter, ModelLoadError, QueueFull

PROMPT = "Once upon a time"


def _repository(tmp_path: Path, model_dir: Path, parameters: dict[str, str]) -> Path:
    folder = tmp_path / "models" / "tiny_llama"
    folder.mkdir(parents=True)
    shutil.copytree(model_dir, folder / "1")  # a symlink would point out of the model folder: refused
    lines = [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in parameters.items()]
    (folder / "config.pbtxt").write_text('name: "tiny_llama"\nbackend: "onnxruntime_genai"\n' + "\n".join(lines))
    return tmp_path / "models"


@pytest.fixture
def serve(tmp_path: Path, model_dir: Path) -> Iterator[object]:
    pytest.importorskip("onnxruntime_genai")
    started: list[InferenceService] = []

    def start(parameters: dict[str, str], memory: MemoryGovernor | None = None,
              mode: str = "none") -> InferenceService:
        service = InferenceService(_repository(tmp_path / str(len(started)), model_dir, parameters),
                                   ModelsConfig(control_mode=mode), memory=memory)  # type: ignore[arg-type]
        started.append(service)
        service.start()
        return service
    yield start
    for service in started:
        service.close()


def _sampled(seed: int) -> GenerationRequest:
    return GenerationRequest("tiny_llama", prompt=PROMPT, max_tokens=120, temperature=1.0, seed=seed)


def _text(events: list[GenerationEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_sequences_side_by_side_give_what_each_gives_alone(serve, model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    service = serve({"max_sequences": "4"})
    together = [service.generation.submit(_sampled(seed)) for seed in (1, 2, 3)]
    greedy = service.generation.submit(GenerationRequest("tiny_llama", prompt=PROMPT, max_tokens=24, temperature=0))
    side_by_side = [list(stream) for stream in together]
    assert _text(list(greedy)) == og_greedy(model_dir, PROMPT, 24)[2]
    alone = [list(service.generation.submit(_sampled(seed))) for seed in (1, 2, 3)]
    assert [_text(e) for e in side_by_side] == [_text(e) for e in alone], "generators beside each other interfere"
    assert all(isinstance(e[-1], Finished) and e[-1].reason in ("stop", "length") for e in side_by_side)
    stats = service.generation.statistics("tiny_llama")
    assert stats is not None and stats["requests"]["completed"] == 7 and stats["in_flight"] == 0


def test_the_line_is_bounded_by_both_limits() -> None:
    gate = SequenceGate(generation_limits("tiny_llama", {"max_sequences": "2", "max_waiting": "1"}))
    for _ in range(3):
        gate.admit("tiny_llama")
    with pytest.raises(QueueFull, match=r"generating 2 sequence\(s\) \(parameter max_sequences\) and 1 requests "
                                        r"wait for a slot \(parameter max_waiting\)"):
        gate.admit("tiny_llama")
    gate.leave()
    gate.admit("tiny_llama")


def test_a_request_cancelled_while_it_waits_leaves_with_nothing_generated(serve) -> None:  # type: ignore[no-untyped-def]
    service = serve({"max_sequences": "1"})
    gate = service.generation._gate("tiny_llama")
    # The model's one slot is held here, as a generating request holds it. A real generation in it could end
    # (a loaded CI machine saw it) before the waiting request's cancel, which then took the slot and ran.
    assert gate.running.acquire(timeout=10)
    try:
        waiting = service.generation.submit(_sampled(2))
        waiting.cancel()
        last = list(waiting)[-1]
    finally:
        gate.running.release()
    assert isinstance(last, Finished) and last.reason == "cancelled" and last.usage.completion_tokens == 0
    assert gate.admitted == 0
    assert isinstance(list(service.generation.submit(_sampled(1)))[-1], Finished), "the slot serves again"


def test_a_request_has_left_the_line_when_its_answer_is_read(serve) -> None:  # type: ignore[no-untyped-def]
    # With no line (max_waiting 0) a client that sends its next request as soon as it has read the answer, a
    # refusal or the last token, must be admitted: CI saw a 429 naming a sequence that had already ended,
    # because the worker left the gate only after handing the consumer its terminal item. The consumer here is
    # an event loop, as in the HTTP server, and the interpreter switches threads as often as it can, so the
    # loop runs its callback while the worker is still inside its hand-over.
    service = serve({"max_sequences": "1", "max_waiting": "0", "max_prompt_tokens": "6"})
    gate = service.generation._gate("tiny_llama")  # the model's one gate: requests generating or waiting
    held: list[int] = []

    async def ask(request: GenerationRequest) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def sink(events: list[GenerationEvent], error: BaseException | None) -> None:
            if error is not None or any(isinstance(e, Finished) for e in events):
                held.append(gate.admitted)
                done.set_result(None)
        service.generation.submit(request, deliver=(loop, sink))
        await done

    async def alternate() -> None:
        for _ in range(100):
            await ask(GenerationRequest("tiny_llama", prompt=PROMPT * 4))  # refused: the prompt is too long
            await ask(GenerationRequest("tiny_llama", prompt="Once", max_tokens=1))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        asyncio.run(alternate())
    finally:
        sys.setswitchinterval(switch)
    assert held == [0] * 200, f"{sum(held)} of 200 answers arrived while their request still held its place"


def test_prompt_and_output_token_limits_are_enforced(serve) -> None:  # type: ignore[no-untyped-def]
    service = serve({"max_prompt_tokens": "6", "max_output_tokens": "5"})
    with pytest.raises(InvalidParameter, match=r"takes at most 6 \(parameter max_prompt_tokens\)") as long_prompt:
        list(service.generation.submit(GenerationRequest("tiny_llama", prompt=PROMPT * 4)))
    assert long_prompt.value.param == "prompt"
    with pytest.raises(InvalidParameter, match=r"max_tokens 6 is more .* at most 5 \(parameter max_output_tokens"):
        list(service.generation.submit(GenerationRequest("tiny_llama", prompt="Once", max_tokens=6)))
    last = list(service.generation.submit(GenerationRequest("tiny_llama", prompt="Once", temperature=0)))[-1]
    assert isinstance(last, Finished) and last.usage.completion_tokens <= 5


@pytest.mark.parametrize(("parameters", "words"), [
    ({"max_sequences": "many"}, "parameter max_sequences must be a positive integer, found 'many'"),
    ({"max_waiting": "-1"}, "parameter max_waiting must be a non-negative integer, found '-1'"),
    ({"max_waiting": "0"}, None),  # no line: a busy model refuses at once
    ({"max_sequences": "65"}, "max_sequences is at most 64, found 65"),
    ({"kv_cache_dtype": "float8"}, "kv_cache_dtype must be one of float32, float16, bfloat16, int8, found 'float8'"),
])
def test_bad_limits_are_refused_naming_the_parameter(parameters: dict[str, str], words: str | None,
                                                     model_dir: Path) -> None:
    def check() -> None:
        limits = generation_limits("tiny_llama", parameters)
        kv_cache_bytes(read_decoder_shape(model_dir, "tiny_llama"), limits, parameters, "tiny_llama")
    if words is None:
        check()
        return
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check()


def test_a_load_with_a_bad_limit_fails_with_the_parameter_named(serve) -> None:  # type: ignore[no-untyped-def]
    service = serve({"max_sequences": "0"}, mode="explicit")
    with pytest.raises(ModelLoadError, match="parameter max_sequences must be a positive integer, found '0'"):
        service.load_model("tiny_llama")


def test_the_kv_cache_of_max_sequences_is_charged_and_refuses_a_load_it_does_not_fit(serve,  # type: ignore[no-untyped-def]
                                                                                     model_dir: Path) -> None:
    shape = read_decoder_shape(model_dir, "tiny_llama")
    assert (shape.layers, shape.kv_heads, shape.head_size, shape.context_length) == (2, 2, 16, 256)
    per_sequence = 2 * 2 * 2 * 16 * 256 * 4  # key and value, layers, KV heads, head size, tokens, float32
    config = MemoryConfig(budget_mb=2, load_estimate_factor=1.0)  # the weights (0.5 MB) fit, 64 KV caches not
    refused = serve({"max_sequences": "64"}, MemoryGovernor(config), mode="explicit")
    assert per_sequence == 128 * 1024
    with pytest.raises(ModelLoadError, match=r"memory budget is 2\.0 MiB.*KV cache, 8\.0 MiB for max_sequences 64 "
                                             r"x max_length 256 tokens"):
        refused.load_model("tiny_llama")
    memory = MemoryGovernor(config)
    fits = serve({"max_sequences": "2"}, memory, mode="explicit")
    fits.load_model("tiny_llama")
    assert fits.model_ready("tiny_llama")
    charged = memory.budget.charges()["tiny_llama/1"]
    assert charged >= 2 * per_sequence
    assert charged == fits.version_info("tiny_llama").footprint_bytes


def test_a_lazily_loaded_model_generates_under_its_own_limits(tmp_path: Path, model_dir: Path) -> None:
    pytest.importorskip("onnxruntime_genai")
    repository = _repository(tmp_path, model_dir, {"max_sequences": "3", "max_waiting": "0"})
    service = InferenceService(repository, ModelsConfig(load="lazy"))
    service.start()
    try:
        assert service.needs_load("tiny_llama")
        events = list(service.generation.submit(_sampled(1)))
        assert isinstance(events[-1], Finished) and _text(events)
        stats = service.generation.statistics("tiny_llama")
        assert stats is not None and stats["limits"]["max_sequences"] == 3, "the config read by the load applies"
    finally:
        service.close()
