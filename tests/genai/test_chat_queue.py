"""The per-model line of chat requests is bounded: one generating, MAX_WAITING waiting, the next refused with
OpenAI's 429 and a message saying why."""

from __future__ import annotations

import orjson
import pytest

from edged.errors import QueueFull
from edged.serving._chat import MAX_WAITING, _Gate
from edged.serving._openai import openai_error


def test_the_line_is_bounded_and_frees_up() -> None:
    gate = _Gate()
    for _ in range(MAX_WAITING + 1):
        gate.admit("tiny_llama")
    with pytest.raises(QueueFull, match=f"{MAX_WAITING} requests wait") as refused:
        gate.admit("tiny_llama")
    response = openai_error(refused.value)
    assert response.status == 429
    assert orjson.loads(response.body)["error"]["type"] == "rate_limit_error"
    gate.leave()
    gate.admit("tiny_llama")  # a place came free
