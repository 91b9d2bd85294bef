"""The per-model line of generation requests is bounded: max_sequences generating, MAX_WAITING waiting, the next
refused with OpenAI's 429 and a message saying why."""

from __future__ import annotations

import orjson
import pytest

from edged.engine.generation_gate import MAX_WAITING, SequenceGate
from edged.errors import QueueFull
from edged.serving._openai import openai_error


def test_the_line_is_bounded_and_frees_up() -> None:
    gate = SequenceGate()
    for _ in range(MAX_WAITING + 1):
        gate.admit("tiny_llama")
    with pytest.raises(QueueFull, match=f"{MAX_WAITING} requests wait") as refused:
        gate.admit("tiny_llama")
    response = openai_error(refused.value)
    assert response.status == 429
    assert orjson.loads(response.body)["error"]["type"] == "rate_limit_error"
    gate.leave()
    gate.admit("tiny_llama")  # a place came free
