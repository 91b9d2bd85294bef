"""The reference beside ``--transport openai``: ORT GenAI's own generator loop in this process on the same model
folder, one generation after another, measured with the same definitions (edged/bench/_openai.py).

It runs the prompt the daemon read as the same number of token ids (the calibrated words, tokenized without the
chat template and cut or repeated to length), greedy, up to the same ``max_tokens``; the end-of-sequence token
ends a generation and is not counted, as the daemon counts. What the daemon adds on top of this row is the cost
of serving: HTTP, SSE, scheduling, the event loop.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from edged.bench._openai import GenResult, Load, Sample, Tally, summarize


def model_folder(repository: Path, model: str) -> Path | None:
    """The highest numbered version folder of ``model`` in ``repository``, or None when there is none."""
    root = repository / model
    versions = [p for p in root.iterdir() if p.is_dir() and p.name.isdigit()] if root.is_dir() else []
    return max(versions, key=lambda p: int(p.name)) if versions else None


def run_raw_genai(folder: Path, label: str, load: Load, prompt: str, prompt_tokens: int,
                  duration_s: float) -> GenResult:
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    words = [int(t) for t in tokenizer.encode(prompt)] or [0]
    tokens = (words * (prompt_tokens // len(words) + 1))[:prompt_tokens]
    eos = json.loads((folder / "genai_config.json").read_text()).get("model", {}).get("eos_token_id", [])
    stops = frozenset(eos if isinstance(eos, list) else [eos])
    tally = Tally()
    clock = time.perf_counter
    began_all = clock()
    end = began_all + duration_s
    while not tally.samples or clock() < end:
        began = clock()
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(tokens) + load.output_tokens, do_sample=False)
        generator = og.Generator(model, params)
        stream = tokenizer.create_stream()
        generator.append_tokens(tokens)
        first: float | None = None
        count = 0
        while not generator.is_done():
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if token in stops:
                break
            stream.decode(token)
            count += 1
            if first is None:
                first = clock() - began
        tally.add(Sample(clock() - began, first, len(tokens), count))
    return summarize(label, load, 1, tally, clock() - began_all, transport="raw-onnxruntime-genai")
