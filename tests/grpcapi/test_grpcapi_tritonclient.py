"""Triton's own gRPC clients, unchanged, against the real daemon: sync, asyncio and streaming, over loopback TCP
and the Unix socket, including system shared memory made with tritonclient.utils.shared_memory."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import queue
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_aio
import tritonclient.utils.shared_memory as triton_shm
from grpcapi_daemon import SHM_KEY, GrpcDaemon
from integration.edged_daemon import config_with_fakes, start_daemon
from tritonclient.utils import InferenceServerException

KEY = {SHM_KEY[0]: SHM_KEY[1]}


def _tiny_input(batch: int = 1, value: float = 1.0) -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("input", [batch, 64], "FP32")
    tensor.set_data_from_numpy(np.full((batch, 64), value, dtype=np.float32))
    return tensor


@pytest.fixture(params=["tcp", "unix"])
def url(request: pytest.FixtureRequest, grpc_daemon: GrpcDaemon) -> str:
    return grpc_daemon.tcp if request.param == "tcp" else grpc_daemon.unix


def test_sync_client_health_metadata_config_index_and_statistics(url: str) -> None:
    client = triton_grpc.InferenceServerClient(url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny_mlp") and not client.is_model_ready("no_such_model")
    assert "system_shared_memory" in client.get_server_metadata().extensions
    metadata = client.get_model_metadata("tiny_mlp")
    assert (metadata.inputs[0].name, list(metadata.inputs[0].shape), metadata.inputs[0].datatype) == (
        "input", [-1, 64], "FP32")
    assert client.get_model_config("tiny_mlp").config.name == "tiny_mlp"
    index = {model.name: model.state for model in client.get_model_repository_index(headers=KEY).models}
    assert index["tiny_mlp"] == "READY"
    client.infer("tiny_mlp", [_tiny_input()])
    stats = client.get_inference_statistics("tiny_mlp").model_stats[0]
    assert stats.name == "tiny_mlp" and stats.inference_count >= 1


def test_sync_infer_matches_the_http_socket_answer(url: str, grpc_daemon: GrpcDaemon) -> None:
    client = triton_grpc.InferenceServerClient(url)
    result = client.infer("tiny_mlp", [_tiny_input(3, 0.5)], outputs=[triton_grpc.InferRequestedOutput("output")])
    expected = grpc_daemon.daemon.client().infer("tiny_mlp", {"input": np.full((3, 64), 0.5, np.float32)})
    np.testing.assert_allclose(result.as_numpy("output"), expected.outputs["output"], rtol=1e-6)


def test_asyncio_client_runs_concurrent_requests(url: str) -> None:
    async def run() -> list[Any]:
        client = triton_aio.InferenceServerClient(url)
        try:
            assert await client.is_server_ready()
            results = await asyncio.gather(*(client.infer("tiny_mlp", [_tiny_input(1, float(i))])
                                             for i in range(8)))
            return [r.as_numpy("output") for r in results]
        finally:
            await client.close()

    outputs = asyncio.run(run())
    assert len(outputs) == 8 and all(out.shape == (1, 10) for out in outputs)
    assert not np.allclose(outputs[0], outputs[7])


def test_a_stream_keeps_serving_after_a_bad_request_in_the_middle(url: str) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = triton_grpc.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("tiny_mlp", [_tiny_input()], request_id="first")
        bad = triton_grpc.InferInput("input", [1, 63], "FP32")
        bad.set_data_from_numpy(np.ones((1, 63), np.float32))
        client.async_stream_infer("tiny_mlp", [bad], request_id="bad")
        client.async_stream_infer("no_such_model", [_tiny_input()], request_id="unknown")
        client.async_stream_infer("tiny_mlp", [_tiny_input(2)], request_id="last")
        got = [answers.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
    served = {result.get_response().id: result.as_numpy("output").shape for result, error in got if error is None}
    errors = [str(error) for result, error in got if error is not None]
    assert served == {"first": (1, 10), "last": (2, 10)}
    assert len(errors) == 2 and any("no_such_model" in message for message in errors)


def test_every_streamed_answer_says_it_is_the_requests_final_response(url: str) -> None:
    # Triton's streamed responses carry "triton_final_response" (docs/user_guide/decoupled_models.md): clients
    # written for any model read it to know that a request is complete
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = triton_grpc.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for n in range(4):  # the same layout again and again: the repeated-response path too
            client.async_stream_infer("tiny_mlp", [_tiny_input(value=float(n))], request_id=f"r{n}")
        got = [answers.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got)
    unary = client.infer("tiny_mlp", [_tiny_input(value=3.0)])
    for result, _ in got:
        parameters = result.get_response().parameters
        assert set(parameters) == {"triton_final_response"} and parameters["triton_final_response"].bool_param
        if result.get_response().id == "r3":
            np.testing.assert_array_equal(result.as_numpy("output"), unary.as_numpy("output"))
    assert "triton_final_response" not in unary.get_response().parameters  # unary answers carry none, as Triton's


def test_the_standard_grpc_health_check_answers_serving_as_tritons_does(url: str) -> None:
    # grpc.health.v1.Health/Check (Kubernetes' grpc probes, grpc_health_probe) is served by Triton: SERVING while
    # the server is ready, whatever service the request names; Watch is not (UNIMPLEMENTED, as in Triton)
    grpc = pytest.importorskip("grpc")
    with grpc.insecure_channel(url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=bytes,
                                    response_deserializer=bytes)
        assert check(b"", timeout=30) == b"\x08\x01"  # HealthCheckResponse{status: SERVING}
        assert check(b"\x0a\x05edged", timeout=30) == b"\x08\x01"  # HealthCheckRequest{service: "edged"}
        with pytest.raises(grpc.RpcError) as bad:
            check(b"\x0a\x7f", timeout=30)  # a string field running past the message
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=bytes,
                                     response_deserializer=bytes)
        with pytest.raises(grpc.RpcError) as unserved:
            list(watch(b"", timeout=30))
        assert unserved.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_system_shared_memory_inputs_and_outputs_with_tritonclient_utils(url: str) -> None:
    client = triton_grpc.InferenceServerClient(url)
    data = np.arange(2 * 64, dtype=np.float32).reshape(2, 64) / 100
    in_key, out_key = f"/edged-grpc-in-{os.getpid()}", f"/edged-grpc-out-{os.getpid()}"
    handle_in = triton_shm.create_shared_memory_region("grpc_in", in_key, data.nbytes)
    handle_out = triton_shm.create_shared_memory_region("grpc_out", out_key, 2 * 10 * 4)
    try:
        triton_shm.set_shared_memory_region(handle_in, [data])
        client.register_system_shared_memory("grpc_in", in_key, data.nbytes, headers=KEY)
        client.register_system_shared_memory("grpc_out", out_key, 80, headers=KEY)
        status = client.get_system_shared_memory_status(headers=KEY)
        assert {"grpc_in", "grpc_out"} <= set(status.regions)
        tensor = triton_grpc.InferInput("input", [2, 64], "FP32")
        tensor.set_shared_memory("grpc_in", data.nbytes)
        output = triton_grpc.InferRequestedOutput("output")
        output.set_shared_memory("grpc_out", 80)
        if not url.startswith("unix"):  # over TCP a ModelInfer naming regions needs the key too, as HTTP's infer
            triton_shm.set_shared_memory_region(handle_out, [np.full((2, 10), 7.0, np.float32)])
            with pytest.raises(InferenceServerException, match="edged-key") as refused:
                client.infer("tiny_mlp", [tensor], outputs=[output])
            assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
            np.testing.assert_array_equal(triton_shm.get_contents_as_numpy(handle_out, np.float32, [2, 10]), 7.0)
        result = client.infer("tiny_mlp", [tensor], outputs=[output], headers=KEY)
        assert not result.get_response().raw_output_contents[0]  # the data went to the region, not the reply
        placed = triton_shm.get_contents_as_numpy(handle_out, np.float32, [2, 10])
        direct = client.infer("tiny_mlp", [_inline(data)]).as_numpy("output")
        np.testing.assert_allclose(placed, direct, rtol=1e-6)
    finally:
        client.unregister_system_shared_memory(headers=KEY)
        triton_shm.destroy_shared_memory_region(handle_in)
        triton_shm.destroy_shared_memory_region(handle_out)
    assert not client.get_system_shared_memory_status(headers=KEY).regions


def _inline(data: np.ndarray[Any, Any]) -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("input", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


def test_over_tcp_shared_memory_and_repository_changes_need_the_configured_metadata_key(
        grpc_daemon: GrpcDaemon) -> None:
    client = triton_grpc.InferenceServerClient(grpc_daemon.tcp)  # the Unix socket judges peers instead
    with pytest.raises(InferenceServerException, match="shared-memory") as refused:
        client.get_system_shared_memory_status()
    assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
    with pytest.raises(InferenceServerException, match="model-repository"):
        client.unload_model("tiny_mlp", headers={SHM_KEY[0]: "wrong"})
    client.load_model("tiny_mlp", headers=KEY)  # loading a loaded model reloads it: still ready afterwards
    assert client.is_model_ready("tiny_mlp")


def test_cuda_shared_memory_answers_as_a_gpu_less_triton(url: str) -> None:
    client = triton_grpc.InferenceServerClient(url)
    assert not client.get_cuda_shared_memory_status(headers=KEY).regions
    with pytest.raises(InferenceServerException, match="GPUs not supported") as refused:
        client.register_cuda_shared_memory("gpu", base64.b64encode(b"handle"), 0, 64, headers=KEY)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_a_region_past_the_mapped_bytes_limit_is_resource_exhausted_naming_the_key(url: str) -> None:
    """A server's resource is spent, not an argument wrong (HTTP answers 413 for the same, with the same text)."""
    client = triton_grpc.InferenceServerClient(url)
    with pytest.raises(InferenceServerException, match="shm_max_bytes_mb") as refused:
        client.register_system_shared_memory("huge", "/edged-grpc-huge", 1024 * 1024 * 1024 + 1, headers=KEY)
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "huge" not in client.get_system_shared_memory_status(headers=KEY).regions


def test_the_grpc_socket_gets_the_configured_mode(grpc_daemon: GrpcDaemon) -> None:
    info = grpc_daemon.socket_path.lstat()
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600


def test_edged_status_shows_the_grpc_listeners_and_counters(grpc_daemon: GrpcDaemon) -> None:
    shown = subprocess.run([sys.executable, "-m", "edged", "status", "--socket", str(grpc_daemon.daemon.socket_path)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    assert f"grpc {grpc_daemon.tcp}" in shown.stdout and f"grpc unix:{grpc_daemon.socket_path}" in shown.stdout
    grpc = grpc_daemon.daemon.client().status()["grpc"]
    row = next(line for line in shown.stdout.splitlines() if line.startswith("grpc "))
    assert row.split(None, 1)[1].startswith("connections "), row
    assert f"stream in flight peak {grpc['stream_in_flight_peak']} of {grpc['stream_in_flight_limit']}" in row
    assert "socket-activated" not in row  # edged created its socket here


def test_serve_flags_open_the_grpc_listeners(tmp_path: Path) -> None:
    socket_path = tmp_path / "flag-grpc.sock"
    daemon = start_daemon(tmp_path / "d", config=config_with_fakes(),
                          args=["--grpc-socket", str(socket_path), "--grpc-port", "0"])
    try:
        listeners = daemon.client().status()["grpc_listeners"]
        assert f"unix:{socket_path}" in listeners and len(listeners) == 2
        assert triton_grpc.InferenceServerClient(f"unix://{socket_path}").is_server_live()
    finally:
        daemon.stop()
    assert not socket_path.exists()  # removed at shutdown: absent while the daemon is down


def test_http_and_grpc_share_one_shared_memory_registry(grpc_daemon: GrpcDaemon) -> None:
    key = f"/edged-grpc-shared-{os.getpid()}"
    handle = triton_shm.create_shared_memory_region("shared_both", key, 256)
    http = grpc_daemon.daemon.client()
    client = triton_grpc.InferenceServerClient(grpc_daemon.unix)
    try:
        http.register_system_shared_memory("from_http", key, 256)  # over the Unix socket, by peer credentials
        status = client.get_system_shared_memory_status("from_http", headers=KEY)
        assert (status.regions["from_http"].key, status.regions["from_http"].byte_size) == (key, 256)
        client.unregister_system_shared_memory("from_http", headers=KEY)
        assert http.system_shared_memory_status() == []
    finally:
        http.unregister_system_shared_memory()
        triton_shm.destroy_shared_memory_region(handle)


def test_lazily_loaded_models_load_on_their_first_metadata_or_infer_call(tmp_path: Path) -> None:
    socket_path = tmp_path / "lazy-grpc.sock"
    daemon = start_daemon(tmp_path / "d", config=config_with_fakes('load = "lazy"\n'),
                          args=["--grpc-socket", str(socket_path)])
    try:
        client = triton_grpc.InferenceServerClient(f"unix://{socket_path}")
        assert client.get_model_metadata("tiny_mlp").inputs[0].name == "input"
        assert client.get_model_config("digits_onnx").config.name == "digits_onnx"
        assert client.infer("camera_frame", [_frame()]).as_numpy("features").shape[-1] == 8
    finally:
        daemon.stop()


def _frame() -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("frame", [1, 1080, 1920, 3], "UINT8")
    tensor.set_data_from_numpy(np.zeros((1, 1080, 1920, 3), np.uint8))
    return tensor


def test_inference_limited_to_listed_users_is_refused_over_grpc_tcp_unary_and_stream(tmp_path: Path) -> None:
    config = config_with_fakes() + '\n[server.access]\ninfer_users = ["root"]\n'
    daemon = start_daemon(tmp_path / "d", config=config, args=["--grpc-port", "0"])
    try:
        client = triton_grpc.InferenceServerClient(daemon.client().status()["grpc_listeners"][0])
        assert client.is_server_ready()  # health stays open
        with pytest.raises(InferenceServerException, match=r"server\.access limits it to listed users") as refused:
            client.infer("tiny_mlp", [_tiny_input()])
        assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        with contextlib.suppress(InferenceServerException):  # the stream may already be closed by the refusal
            client.async_stream_infer("tiny_mlp", [_tiny_input()])
        result, error = answers.get(timeout=30)
        client.stop_stream()
        assert result is None and "PERMISSION_DENIED" in str(error.status())
    finally:
        daemon.stop()


def test_a_load_override_takes_int64_strings_and_names_a_refused_field_once(grpc_daemon: GrpcDaemon) -> None:
    client = triton_grpc.InferenceServerClient(grpc_daemon.unix)
    config = client.get_model_config("tiny_mlp", as_json=True)["config"]  # MessageToJson: int64 dims as strings
    config = {key: config[key] for key in ("name", "backend", "max_batch_size", "input", "output")}
    assert all(isinstance(d, str) for d in config["input"][0]["dims"]), config
    client.load_model("tiny_mlp", config=json.dumps(config))  # before: refused, "expects an integer, found string"
    assert client.is_model_ready("tiny_mlp")
    config["input"][0]["dims"] = ["sixty-four"]
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("tiny_mlp", config=json.dumps(config))
    assert refused.value.message() == ("load request for model tiny_mlp: field 'input[0].dims' expects an integer, "
                                       'found string "sixty-four"'), refused.value.message()
    assert client.is_model_ready("tiny_mlp")


def test_model_config_of_a_model_with_kept_fields_written_loosely(tmp_path: Path) -> None:
    # Triton's text format lets a bool be 1 and a repeated field be given once; edged keeps such fields (it applies
    # none of them) and must report them as Triton's message types them. Before, gRPC's ModelConfig answered
    # INVALID_ARGUMENT "cannot express ModelConfig in Triton's message" for this loaded, serving model.
    from modelgen import add_model, mlp_weights
    add_model(tmp_path / "repo", "loose", 'name: "loose"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
              'optimization { cuda { graphs: 1 } }\nresponse_cache { enable: 1 }\n'
              'model_metrics { metric_control { metric_identifier { family: "nv_inference_request_duration_us" } '
              'histogram_options { buckets: 100 } } }\n', {1: mlp_weights()})
    daemon = start_daemon(tmp_path / "d", config=config_with_fakes("[server]\ngrpc_port = 0\n"),
                          args=["--model-repository", str(tmp_path / "repo")])
    try:
        tcp = next(a for a in daemon.client().status()["grpc_listeners"] if not a.startswith("unix:"))
        config = triton_grpc.InferenceServerClient(tcp).get_model_config("loose").config
        assert config.optimization.cuda.graphs is True
        assert config.response_cache.enable is True
        assert list(config.model_metrics.metric_control[0].histogram_options.buckets) == [100.0]
    finally:
        daemon.stop()
