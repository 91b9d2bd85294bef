"""Batching over gRPC: concurrent tritonclient.grpc clients, each on its own connection, to a model with a short
batching delay (one a lone request's caller may wait out on the event loop) still get batches of several.

Before: the loop thread waited the delay out for the first request it read, the other clients' requests stayed
unread meanwhile, the batch ran alone and confirmed the bet, and every batch was a batch of one (perf_analyzer
-i grpc at concurrency 16, D = 200 µs: mean batch 1.0). Now only a worker's batch of one counts as evidence of
lone traffic, a worker waits out every CALLER_PROBE_EVERY-th lone batch with the loop free, and requests from
several connections read in one loop iteration are submitted together (edged.grpcapi._infer)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from integration.edged_daemon import config_with_fakes, start_daemon
from modelgen import add_tiny_delay_model

from edged.engine.worker_pool import CALLER_DELAY_MAX_NS

CLIENTS = 16
REQUESTS_EACH = 40
DELAY_US = 400  # at most CALLER_DELAY_MAX_NS: a lone request's caller would wait it out


def _repo(tmp_path: Path) -> Path:
    return add_tiny_delay_model(tmp_path / "repo", "tiny_d", CLIENTS, DELAY_US)


@pytest.mark.parametrize("listener", ["tcp", "unix"])
def test_sixteen_grpc_clients_with_a_short_delay_get_batches_of_several(tmp_path: Path, listener: str) -> None:
    """Over the Unix socket each connection has an inference path of its own (shared memory used as its peer):
    the senders are still told apart and gathered across them (one ``Gathering`` per server)."""
    assert DELAY_US * 1000 <= CALLER_DELAY_MAX_NS
    where = "grpc_port = 0" if listener == "tcp" else f'grpc_socket = "{tmp_path}/grpc.sock"'
    config = config_with_fakes(f'repository = "{_repo(tmp_path)}"\n\n[server]\n{where}\n')  # in [models]
    daemon = start_daemon(tmp_path / "d", config=config)
    try:
        client = daemon.client()
        address = next(address for address in client.status()["grpc_listeners"]
                   if address.startswith("unix:") == (listener == "unix"))
        errors: list[BaseException] = []
        start = threading.Barrier(CLIENTS)

        def one_client() -> None:
            try:
                grpc_client = triton_grpc.InferenceServerClient(address)  # its own channel: its own connection
                tensor = triton_grpc.InferInput("input", [1, 64], "FP32")
                tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
                start.wait(30)
                for _ in range(REQUESTS_EACH):
                    result = grpc_client.infer("tiny_d", [tensor])
                    assert result.as_numpy("output").shape == (1, 10)
                grpc_client.close()
            except BaseException as e:  # reported by the test's thread below
                errors.append(e)

        threads = [threading.Thread(target=one_client) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        stats = client.statistics("tiny_d")["model_stats"][0]
        assert stats["inference_count"] == CLIENTS * REQUESTS_EACH
        sizes = {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats["batch_stats"]}
        mean = stats["inference_count"] / stats["execution_count"]
        # batches of one only was the defect; concurrent clients that wait for their answers batch several
        assert mean >= 2.0, (mean, sizes)
        assert max(sizes) > 1
    finally:
        daemon.stop()
