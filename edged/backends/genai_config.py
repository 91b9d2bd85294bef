"""What a generative model folder and its config.pbtxt say about limits and memory, read without any runtime, so
that memory admission, ``edged models validate`` and the backend agree on the same numbers.

Limits come from config.pbtxt ``parameters`` (each optional, each an integer; anything else is refused
with the parameter named): ``max_sequences`` (sequences generated at once, default 1, at most 64),
``max_waiting`` (requests waiting for a sequence slot, default 8; 0 allowed), ``max_prompt_tokens`` and
``max_output_tokens`` (default: the model's context length).

The KV cache is what ORT GenAI allocates per sequence for ``max_length`` tokens (its past/present buffer is
sized once, up front): 2 (key and value) x layers x KV heads x head size x max_length x element size, where
max_length is the most the daemon ever asks for (the context length, cut by the two token limits) and the
element size is ``kv_cache_dtype`` (default float32 on the CPU provider, float16 when the model names the CUDA
or TensorRT provider, as ORT GenAI's model builder writes them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.errors import ModelConfigError

GENAI_CONFIG = "genai_config.json"
LIMIT_PARAMETERS = ("max_sequences", "max_waiting", "max_prompt_tokens", "max_output_tokens")
KV_DTYPE_PARAMETER = "kv_cache_dtype"
KV_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
MAX_SEQUENCES_LIMIT = 64  # one worker thread each: past this a device is better served by queueing
_GPU_PROVIDERS = frozenset({"cuda", "tensorrt", "NvTensorRtRtx"})


@dataclass(frozen=True)
class GenerationLimits:
    max_sequences: int = 1
    max_waiting: int = 8
    max_prompt_tokens: int | None = None  # None: the context length
    max_output_tokens: int | None = None


@dataclass(frozen=True)
class DecoderShape:
    layers: int
    kv_heads: int
    head_size: int
    context_length: int
    gpu: bool  # the model names a GPU execution provider


def generation_limits(model: str, parameters: Mapping[str, str]) -> GenerationLimits:
    values: dict[str, int] = {}
    for name in LIMIT_PARAMETERS:
        raw = parameters.get(name)
        if raw is None:
            continue
        least = 0 if name == "max_waiting" else 1  # no line at all is a valid choice: refuse when busy
        try:
            value = int(raw)
        except ValueError:
            value = least - 1
        if value < least:
            kind = "a non-negative" if least == 0 else "a positive"
            raise ModelConfigError(f"model {model}: parameter {name} must be {kind} integer, found {raw!r}")
        values[name] = value
    limits = GenerationLimits(**values)
    if limits.max_sequences > MAX_SEQUENCES_LIMIT:
        raise ModelConfigError(f"model {model}: parameter max_sequences is at most {MAX_SEQUENCES_LIMIT}, found "
                               f"{limits.max_sequences}")
    return limits


def read_decoder_shape(folder: Path, model: str) -> DecoderShape:
    """The decoder's shape from ``folder``/genai_config.json; ModelConfigError naming what is missing."""
    path = folder / GENAI_CONFIG
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelConfigError(f"model {model}: cannot read {path}: {e}") from e
    section = doc.get("model") if isinstance(doc, dict) else None
    decoder = section.get("decoder") if isinstance(section, dict) else None
    if not isinstance(section, dict) or not isinstance(decoder, dict):
        raise ModelConfigError(f"model {model}: {path} has no model.decoder section")
    search = doc.get("search") if isinstance(doc.get("search"), dict) else {}
    context = section.get("context_length") or search.get("max_length")
    fields: dict[str, Any] = {"num_hidden_layers": decoder.get("num_hidden_layers"),
              "num_key_value_heads": decoder.get("num_key_value_heads", decoder.get("num_attention_heads")),
              "head_size": decoder.get("head_size"), "context_length": context}
    bad = [name for name, value in fields.items() if not isinstance(value, int) or value < 1]
    if bad:
        raise ModelConfigError(f"model {model}: {path} needs positive integers for {', '.join(bad)} "
                               f"(found {', '.join(repr(fields[n]) for n in bad)})")
    return DecoderShape(fields["num_hidden_layers"], fields["num_key_value_heads"], fields["head_size"],
                        fields["context_length"], _names_gpu(decoder))


def max_length(shape: DecoderShape, limits: GenerationLimits) -> int:
    """The most tokens (prompt plus output) one sequence is ever given."""
    if limits.max_prompt_tokens is None or limits.max_output_tokens is None:
        return shape.context_length
    return min(shape.context_length, limits.max_prompt_tokens + limits.max_output_tokens)


def kv_cache_bytes(shape: DecoderShape, limits: GenerationLimits, parameters: Mapping[str, str],
                   model: str) -> int:
    """What the KV caches of ``max_sequences`` sequences of ``max_length`` tokens take together."""
    dtype = parameters.get(KV_DTYPE_PARAMETER, "float16" if shape.gpu else "float32")
    size = KV_DTYPES.get(dtype)
    if size is None:
        raise ModelConfigError(f"model {model}: parameter {KV_DTYPE_PARAMETER} must be one of "
                               f"{', '.join(KV_DTYPES)}, found {dtype!r}")
    per_sequence = 2 * shape.layers * shape.kv_heads * shape.head_size * max_length(shape, limits) * size
    return per_sequence * limits.max_sequences


def weight_bytes(folder: Path) -> int:
    """The model's ONNX files with their external data: what loading reads into memory."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and ".onnx" in p.name)


def _names_gpu(decoder: Mapping[str, Any]) -> bool:
    options = decoder.get("session_options", {}).get("provider_options", [])
    return any(isinstance(o, dict) and any(k in _GPU_PROVIDERS for k in o) for o in options)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
TEMPLATE_FILES = ("chat_template.jinja",)


@dataclass(frozen=True)
class FolderReport:
    shape: DecoderShape
    limits: GenerationLimits
    kv_bytes: int
    weight_bytes: int
    template: Path


def check_model_folder(folder: Path, model: str, parameters: Mapping[str, str]) -> FolderReport:
    """What ORT GenAI needs in a version folder, checked without loading it; ModelConfigError naming what is
    missing or wrong (a decoder file named outside the folder is refused like any path a config names)."""
    shape = read_decoder_shape(folder, model)
    limits = generation_limits(model, parameters)
    kv = kv_cache_bytes(shape, limits, parameters, model)
    doc = json.loads((folder / GENAI_CONFIG).read_text())
    filename = doc["model"]["decoder"].get("filename")
    if not isinstance(filename, str) or not filename:
        raise ModelConfigError(f"model {model}: {folder / GENAI_CONFIG} names no model.decoder.filename")
    decoder = (folder / filename).resolve()
    if folder.resolve() not in decoder.parents:
        raise ModelConfigError(f"model {model}: model.decoder.filename {filename!r} leads outside {folder}")
    if not decoder.is_file():
        raise ModelConfigError(f"model {model}: the decoder {filename!r} named by {GENAI_CONFIG} is not in {folder}")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelConfigError(f"model {model}: no tokenizer in {folder} (expected {' or '.join(TOKENIZER_FILES)})")
    template = next((folder / n for n in TEMPLATE_FILES if (folder / n).is_file()), None)
    if template is None:
        raise ModelConfigError(f"model {model}: no chat template in {folder} (expected "
                               f"{', '.join(TEMPLATE_FILES)})")
    return FolderReport(shape, limits, kv, weight_bytes(folder), template)
