"""What ONNX Runtime GenAI offers for several sequences at once, in process on the bundled tiny Llama: N
`og.Generator` s one after another, N generators in N threads (what edged does with ``max_sequences`` N), and
ORT GenAI's `og.Engine` with N requests (its batching scheduler). Every sequence generates exactly ``--tokens``
tokens (the end-of-sequence token masked), rounds alternate, medians of aggregate output tokens/s are printed.

    .venv/bin/python scripts/bench_genai_batching.py [--sequences 8] [--tokens 128] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny_llama" / "1"
PROMPT = "Once upon a time there was a small device that answered questions"


def one_generator(model: Any, ids: list[int], tokens: int) -> int:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + tokens, min_length=len(ids) + tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    count = 0
    while not generator.is_done():
        generator.generate_next_token()
        generator.get_next_tokens()
        count += 1
    return count


def sequential(model: Any, ids: list[int], tokens: int, n: int) -> float:
    began = time.perf_counter()
    count = sum(one_generator(model, ids, tokens) for _ in range(n))
    return count / (time.perf_counter() - began)


def threaded(model: Any, ids: list[int], tokens: int, n: int) -> float:
    counts: list[int] = []
    threads = [threading.Thread(target=lambda: counts.append(one_generator(model, ids, tokens))) for _ in range(n)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - began)


def engine(model: Any, ids: list[int], tokens: int, n: int) -> float:
    runner = og.Engine(model)
    buffer = runner.create_event_buffer(64)
    requests = []
    began = time.perf_counter()
    for _ in range(n):
        request = runner.create_request()
        options = og.TurnOptions(request)
        options.set_do_sample(False)
        options.set_max_generated_tokens(tokens)
        options.set_min_generated_tokens(tokens)
        request.begin_turn(np.array(ids, dtype=np.int32), options)
        requests.append(request)
    count = finished = 0
    token_flag, done_flag = og.EngineEventFlags.TOKEN.value, og.EngineEventFlags.TURN_FINISHED.value
    while finished < n:
        runner.run(buffer)
        for i in range(len(buffer)):
            flags = buffer[i].flags.value
            count += bool(flags & token_flag)
            finished += bool(flags & (done_flag | og.EngineEventFlags.FAILED.value))
    rate = count / (time.perf_counter() - began)
    for request in requests:
        request.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    model = og.Model(str(MODEL))
    ids = [int(t) for t in og.Tokenizer(model).encode(PROMPT)]
    print(f"og.Engine: configured_max_batch_size {og.Engine(model).get_capabilities().configured_max_batch_size}")
    ways = {"generators one after another": sequential, f"{args.sequences} generators in threads": threaded,
            f"og.Engine, {args.sequences} requests": engine}
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for way in ways.values():
        way(model, ids, 8, 2)  # warm up
    for _ in range(args.rounds):
        for name, way in ways.items():
            rates[name].append(way(model, ids, args.tokens, args.sequences))
    base = statistics.median(rates["generators one after another"])
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"{name:34s} {rate:8.0f} output tokens/s  ({rate / base:.2f}x one after another)")


if __name__ == "__main__":
    main()
