"""The seam for generative models, beside `ModelInstance`: prompt in, a cancellable stream of tokens out.

A generative instance is also a `ModelInstance` (so load, unload, status and memory treat it like any other),
but its ``run`` refuses KServe tensors. Front ends reach generation only through this protocol; the runtime
(ONNX Runtime GenAI) and the chat template engine (Jinja2) stay inside the backend module.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from edged.backends.base import InstanceInfo
from edged.backends.tool_calls import ToolParser


@dataclass(frozen=True)
class Sampling:
    """How to pick tokens. ``temperature == 0`` means greedy decoding, as OpenAI's API defines it."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k limit
    seed: int | None = None
    # constrained decoding: (llguidance grammar type, grammar), e.g. ("json_schema", "{...}"); None: free text
    guidance: tuple[str, str] | None = None


@dataclass(frozen=True)
class Token:
    id: int
    text: str  # the text this token completes (may be "" while a multi-byte character is incomplete)


@runtime_checkable
class GenerativeInstance(Protocol):
    info: InstanceInfo
    context_length: int  # prompt plus output tokens the model takes at most
    tool_parser: ToolParser | None  # how its output writes tool calls (parameters.tool_parser); None: no tools

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                    add_generation_prompt: bool) -> str:
        """The prompt the model's chat template makes of ``messages``; InvalidInput when it refuses them."""
        ...

    def encode(self, text: str) -> list[int]:
        ...

    def generate(self, prompt: Sequence[int], sampling: Sampling, cancelled: threading.Event) -> Iterator[Token]:
        """Yield new tokens until the end-of-sequence token, ``max_new_tokens`` or ``cancelled`` is set.

        Set-up errors (InvalidInput for a grammar in ``sampling.guidance`` the runtime refuses) are raised by
        the call itself, before the first token. Blocking: call it from a worker thread, never from an event
        loop."""
        ...
