"""ONNX Runtime GenAI: generative models (a folder with genai_config.json, the ONNX model, tokenizer files and
a chat template), as `GenerativeInstance` s.

The chat template comes with the model, so it is untrusted: it is rendered in Jinja2's
ImmutableSandboxedEnvironment, as Hugging Face does, and cannot reach the daemon's objects. ORT GenAI's own
``apply_chat_template`` is not used because it does not take tool definitions as data the template can read.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from edged.backends.base import Array, InstanceInfo
from edged.backends.genai_config import KV_DTYPE_PARAMETER, LIMIT_PARAMETERS, TEMPLATE_FILES, generation_limits
from edged.backends.generative import Sampling, Token
from edged.backends.tool_calls import TOOL_PARSER_PARAMETER, ToolParser, parser_for
from edged.errors import BackendUnavailable, EdgedError, InvalidInput, ModelLoadError
from edged.repository.model_config import ModelConfig, ModelSignature

try:
    import jinja2
    import jinja2.sandbox
    import onnxruntime_genai as og
except ImportError as e:  # pragma: no cover - exercised only where the genai extra is missing
    raise BackendUnavailable(f"the onnxruntime_genai backend needs the genai extra: {e}") from e

_WARMUP_TOKENS = 2
# ORT GenAI takes random_seed as a C++ int (a larger one fails its pybind cast, a RuntimeError per request), and
# -1 means "seed from the clock"; OpenAI's seeds are 64-bit, so they are folded into 0 .. 2**31 - 1
_SEED_RANGE = 2**31 - 1
_TOP_P_MIN = 1e-6
_PARAMETERS = frozenset({TOOL_PARSER_PARAMETER, KV_DTYPE_PARAMETER, *LIMIT_PARAMETERS})


class GenAIInstance:
    def __init__(self, folder: Path, config: ModelConfig) -> None:
        self.name = config.name
        self.tool_parser = _tool_parser(config)
        try:
            limits = generation_limits(config.name, config.parameters)
        except EdgedError as e:
            raise ModelLoadError(str(e)) from e
        try:
            self._model = og.Model(str(folder))
            self._tokenizer = og.Tokenizer(self._model)
            genai_config = json.loads((folder / "genai_config.json").read_text())
        except (RuntimeError, OSError, ValueError) as e:
            raise ModelLoadError(f"model {config.name}: ONNX Runtime GenAI cannot load {folder}: {e}") from e
        self.context_length = int(genai_config.get("model", {}).get("context_length")
                                  or genai_config.get("search", {}).get("max_length", 0))
        # top_k's "no limit": ORT GenAI refuses a top_k past the vocabulary ("top_k (n) must be less than or
        # equal to vocab_size"), so the context length, larger than the vocabulary of small models, failed
        # every sampled request; 0: not in the config, the runtime's own default
        self.vocab_size = int(genai_config.get("model", {}).get("vocab_size") or 0)
        eos = genai_config.get("model", {}).get("eos_token_id", [])
        self._eos = frozenset(eos if isinstance(eos, list) else [eos])
        self._template = _load_template(folder, config.name)
        warmed = self._warm_up()
        self.info = InstanceInfo(device="cpu", providers=("onnxruntime_genai",),
                                 details={"context_length": self.context_length,
                                          "max_sequences": limits.max_sequences, "warmup_tokens": warmed})

    def run(self, inputs: Mapping[str, Array], output_names: Sequence[str]) -> dict[str, Array]:
        raise InvalidInput(f"model {self.name!r} is generative (backend onnxruntime_genai): it takes no tensors; "
                           f"use POST /v2/models/{self.name}/generate or POST /v1/chat/completions")

    def release_memory(self) -> None:
        return None

    def close(self) -> None:
        del self._tokenizer, self._model

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                    add_generation_prompt: bool) -> str:
        try:
            return self._template.render(messages=list(messages), tools=tools,
                                         add_generation_prompt=add_generation_prompt)
        except jinja2.TemplateError as e:
            raise InvalidInput(f"model {self.name!r}: its chat template refused the messages: {e}") from e

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._tokenizer.encode(text)]

    def generate(self, prompt: Sequence[int], sampling: Sampling, cancelled: threading.Event) -> Iterator[Token]:
        return self._tokens(self._generator(prompt, sampling), cancelled)

    def _generator(self, prompt: Sequence[int], sampling: Sampling) -> og.Generator:
        params = og.GeneratorParams(self._model)
        options: dict[str, Any] = {"max_length": len(prompt) + sampling.max_new_tokens}
        if sampling.temperature == 0:
            options["do_sample"] = False
        else:
            # top_p 0 is "the most likely token only" to OpenAI, "no nucleus cut" to ORT GenAI (0 and 1 sample
            # alike): the smallest nucleus keeps just the top token
            options.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p or _TOP_P_MIN,
                           top_k=self._top_k(sampling.top_k))
            if sampling.seed is not None:
                options["random_seed"] = fold_seed(sampling.seed)
        params.set_search_options(**options)
        if sampling.guidance is not None:
            params.set_guidance(*sampling.guidance)
        try:
            # llguidance compiles the grammar here, against this model's tokenizer
            generator = og.Generator(self._model, params)
        except RuntimeError as e:
            raise InvalidInput(f"model {self.name!r}: the output constraint does not compile: {e}") from e
        generator.append_tokens(list(prompt))
        return generator

    def _top_k(self, asked: int) -> int:
        """The top_k the runtime takes: none asked (0) or more than the vocabulary is the whole vocabulary."""
        if not self.vocab_size:
            return asked
        return min(asked, self.vocab_size) if asked else self.vocab_size

    def _tokens(self, generator: og.Generator, cancelled: threading.Event) -> Iterator[Token]:
        stream = self._tokenizer.create_stream()
        while not generator.is_done() and not cancelled.is_set():
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if token in self._eos:
                return  # the end of the answer, not a part of it
            yield Token(token, stream.decode(token))

    def _warm_up(self) -> int:
        """Generate a few tokens before serving, so the first request pays no first-run cost; the count made.

        The end-of-sequence token is not yielded, so a model that ends at once warms up with fewer tokens."""
        prompt = self.encode("warm up")
        try:
            return sum(1 for _ in self.generate(prompt, Sampling(_WARMUP_TOKENS, temperature=0), threading.Event()))
        except RuntimeError as e:
            raise ModelLoadError(f"model {self.name}: warm-up generation failed: {e}") from e


def fold_seed(seed: int) -> int:
    """A 64-bit seed (OpenAI's range; a negative one is its two's complement) as the runtime's non-negative
    int32: a seed it takes already is kept (the same tokens as before), a larger one is mixed down with
    splitmix64's finaliser, so that every bit counts (a mask would make 2**31 the same seed as 0)."""
    unsigned = seed % 2**64
    if unsigned <= _SEED_RANGE:
        return unsigned
    mixed = ((unsigned ^ (unsigned >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    mixed = ((mixed ^ (mixed >> 27)) * 0x94D049BB133111EB) % 2**64
    return (mixed ^ (mixed >> 31)) % _SEED_RANGE


def _tool_parser(config: ModelConfig) -> ToolParser | None:
    unknown = sorted(set(config.parameters) - _PARAMETERS)
    if unknown:
        raise ModelLoadError(f"model {config.name}: parameters {', '.join(unknown)} mean nothing to the "
                             f"onnxruntime_genai backend; it reads only {', '.join(sorted(_PARAMETERS))}")
    try:
        return parser_for(config.parameters)
    except ValueError as e:
        raise ModelLoadError(f"model {config.name}: {e}") from e


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Hugging Face's ``tojson`` filter, arguments included, so that templates render as transformers renders them."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _load_template(folder: Path, model: str) -> jinja2.Template:
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = _tojson
    for name in TEMPLATE_FILES:
        path = folder / name
        if path.is_file():
            try:
                return environment.from_string(path.read_text())
            except jinja2.TemplateError as e:
                raise ModelLoadError(f"model {model}: chat template {path} does not parse: {e}") from e
    raise ModelLoadError(f"model {model}: no chat template in {folder} (expected {', '.join(TEMPLATE_FILES)})")


class GenAIBackend:
    name = "onnxruntime_genai"

    def describe(self, model_path: Path) -> ModelSignature:
        return ModelSignature(inputs=(), outputs=(), notes=("generative model: served under /v1",))

    def load(self, model_path: Path, config: ModelConfig, instance_index: int) -> GenAIInstance:
        return GenAIInstance(model_path.parent, config)

    def runtime_info(self) -> dict[str, Any]:
        return {"onnxruntime_genai": og.__version__}

    def available_gpus(self) -> tuple[int, ...]:
        return ()
