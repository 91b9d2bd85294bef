"""gRPC calls whose client is gone are not run while they still wait in the queue (Triton's request
cancellation): a passed ``grpc-timeout`` or a reset stream takes the queued request out unrun, counted as a
failed request; the one already executing completes and its answer is dropped. Real tritonclient.grpc calls
against an in-process GrpcServer on a real ONNX model that takes about 0.2 s per execution."""

from __future__ import annotations

import asyncio
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from modelgen import write_slow_onnx
from tritonclient.utils import InferenceServerException

from edged.config import ModelsConfig, ServerConfig
from edged.engine import InferenceService
from edged.grpcapi import GrpcServer
from edged.shm import SharedMemoryRegistry

CONFIG = """name: "slow"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "input", data_type: TYPE_FP32, dims: [ 1, 64 ] } ]
output [ { name: "output", data_type: TYPE_FP32, dims: [ 1, 64 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
CALLS = 6


@pytest.fixture
def slow_repo(tmp_path: Path) -> Path:
    write_slow_onnx(tmp_path / "repo" / "slow" / "1" / "model.onnx", trips=100_000)
    (tmp_path / "repo" / "slow" / "config.pbtxt").write_text(CONFIG)
    return tmp_path


def _input() -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 64), dtype=np.float32))
    return tensor


def _counts(service: InferenceService) -> tuple[int, int]:
    """(executed, failed) requests of model slow."""
    stats = service.statistics("slow")["model_stats"][0]
    return stats["inference_count"], stats["inference_stats"]["fail"]["count"]


def _settled(service: InferenceService, total: int) -> tuple[int, int]:
    """The counts once every one of ``total`` requests has been run or taken out (the engine goes on after the
    clients have given up)."""
    deadline = time.monotonic() + 30
    while True:
        counts = _counts(service)
        if sum(counts) >= total or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def _serve(root: Path, client_side: Any) -> tuple[Any, tuple[int, int]]:
    path = root / "grpc.sock"

    async def run() -> tuple[Any, tuple[int, int]]:
        service = InferenceService(root / "repo", ModelsConfig())
        service.start()
        server = GrpcServer(service, ServerConfig(grpc_socket=str(path)), SharedMemoryRegistry())
        await server.start()
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(None, client_side, f"unix://{path}")
            return result, await loop.run_in_executor(None, _settled, service, CALLS)
        finally:
            await server.stop(5)
            service.close()

    return asyncio.run(run())


def test_unary_calls_past_their_deadline_are_not_run_while_queued(slow_repo: Path) -> None:
    def clients(url: str) -> list[str]:
        def one(_: int) -> str:
            client = triton_grpc.InferenceServerClient(url)
            try:
                client.infer("slow", [_input()], client_timeout=0.1)
                return "OK"
            except InferenceServerException as e:
                return str(e.status())
            finally:
                client.close()

        with ThreadPoolExecutor(CALLS) as pool:
            return list(pool.map(one, range(CALLS)))

    statuses, (executed, failed) = _serve(slow_repo, clients)
    assert statuses.count("StatusCode.DEADLINE_EXCEEDED") >= CALLS - 1, statuses
    # the one executing when its deadline passed completes; the others never reach the model
    assert executed <= 2, f"{executed} of {CALLS} abandoned requests were run"
    assert executed + failed == CALLS


def test_a_stream_past_its_deadline_leaves_its_queued_requests_unrun(slow_repo: Path) -> None:
    def client_side(url: str) -> list[Any]:
        answers: queue.Queue[Any] = queue.Queue()
        client = triton_grpc.InferenceServerClient(url)
        client.start_stream(callback=lambda result, error: answers.put(error), stream_timeout=0.3)
        try:
            for index in range(CALLS):
                client.async_stream_infer("slow", [_input()], request_id=str(index))
        finally:
            client.stop_stream()  # returns once the stream has ended: here at its deadline
            client.close()
        return [answers.get_nowait() for _ in range(answers.qsize())]

    errors, (executed, failed) = _serve(slow_repo, client_side)
    assert any(error is not None and "DEADLINE_EXCEEDED" in str(error.status()) for error in errors), errors
    assert executed <= 3, f"{executed} of {CALLS} requests of the abandoned stream were run"
    assert executed + failed == CALLS
