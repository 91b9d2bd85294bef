"""What a kind of caller costs before any engine: 16 callers around a bare onnxruntime session, batched perfectly.

    .venv/bin/python scripts/bench_caller_floor.py [--model models/tiny_mlp/1/model.onnx] [--seconds 3]

- threads: 16 threads; the last to arrive runs the 16 requests as one batch and wakes the others (a lock each,
  CPython's cheapest wake-up). No validation, no statistics, no queue: the ceiling for thread-per-request callers.
- asyncio: 16 coroutines on one loop; the requests of one loop turn run as one batch and their futures resolve.

edged's in-process batching numbers (docs/benchmarks.md) are read against these ceilings.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

CALLERS = 16


def session(path: Path) -> tuple[Any, str, list[str]]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return sess, sess.get_inputs()[0].name, [o.name for o in sess.get_outputs()]


def threads_floor(path: Path, seconds: float) -> float:
    sess, name, outputs = session(path)
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    guard = threading.Lock()
    waiting: list[tuple[Any, threading.Lock]] = []
    done = [0] * CALLERS
    stop = threading.Event()

    def caller(index: int) -> None:
        while not stop.is_set():
            wake = threading.Lock()
            wake.acquire()
            with guard:
                waiting.append((x, wake))
                batch = waiting[:] if len(waiting) == CALLERS else []
                if batch:
                    waiting.clear()
            if batch:
                result = sess.run(outputs, {name: np.concatenate([item for item, _ in batch])})[0]
                for row, (_, other) in enumerate(batch):
                    _ = result[row:row + 1]
                    other.release()
            wake.acquire()
            done[index] += 1

    workers = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(CALLERS)]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    time.sleep(seconds)
    stop.set()
    return sum(done) / (time.perf_counter() - began)


def asyncio_floor(path: Path, seconds: float) -> float:
    sess, name, outputs = session(path)
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    pending: list[tuple[Any, asyncio.Future[Any]]] = []
    count = [0]

    def flush() -> None:
        batch = pending[:]
        pending.clear()
        result = sess.run(outputs, {name: np.concatenate([item for item, _ in batch])})[0]
        for row, (_, future) in enumerate(batch):
            future.set_result(result[row:row + 1])

    async def caller(end: float) -> None:
        loop = asyncio.get_running_loop()
        while time.perf_counter() < end:
            future = loop.create_future()
            if not pending:
                loop.call_soon(flush)
            pending.append((x, future))
            await future
            count[0] += 1

    async def main() -> float:
        began = time.perf_counter()
        await asyncio.gather(*(caller(began + seconds) for _ in range(CALLERS)))
        return time.perf_counter() - began

    elapsed = asyncio.run(main())
    return count[0] / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path(__file__).parent.parent / "models/tiny_mlp/1/model.onnx")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print(f"threads, {CALLERS} callers, perfect batches of {CALLERS}: {threads_floor(args.model, args.seconds):,.0f} "
          "infer/s")
    print(f"asyncio, {CALLERS} coroutines, one batch per loop turn: {asyncio_floor(args.model, args.seconds):,.0f} "
          "infer/s")


if __name__ == "__main__":
    main()
