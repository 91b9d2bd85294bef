"""The work one small binary infer request costs the event loop, counted (not timed) over a real Unix socket.

Each point below once cost the loop measurable CPU per request (docs/benchmarks.md); counting the calls the
loop thread makes for one request keeps them from creeping back: a lone request on an idle fast model runs on
the loop thread (no hop), skips the queue, decodes a header it has seen before without parsing it, takes the
engine's quick input check, runs the compiled ONNX Runtime session through an IOBinding bound to its layout
(edged.backends._ort_binding) and is answered in one piece; a request head repeated on its connection skips the
parser, a repeated response layout reuses its encoded head, and the engine runs a lone request straight through
(no queue, no batch).
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import RunningServer, make_server
from loop_calls import LoopCalls

from edged.protocol import decode_response, encode_request

_SCHEDULER_MODULES = {"scheduler.py", "worker_pool.py", "batch_execution.py"}


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, LoopCalls]]:
    calls = LoopCalls()
    threading.setprofile(calls)  # reaches the server's loop thread, which the server starts
    try:
        running = make_server(tmp_path_factory.mktemp("hot"))
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    calls.loop_thread = running._thread.ident
    yield running, calls
    running.stop()


def _infer(sock: socket.socket, body: bytes, header_length: int) -> np.ndarray:
    sock.sendall(b"POST /v2/models/tiny_mlp/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
                 b"content-length: %d\r\ninference-header-content-length: %d\r\n\r\n" % (len(body), header_length)
                 + body)
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, rest = received.partition(b"\r\n\r\n")
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    while len(rest) < int(fields[b"content-length"]):
        rest += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head
    _, outputs = decode_response(rest, int(fields[b"inference-header-content-length"]))
    return outputs["output"]


def test_a_repeated_small_binary_request_costs_the_loop_only_the_short_path(
        counted: tuple[RunningServer, LoopCalls]) -> None:
    running, calls = counted
    rng = np.random.default_rng(0)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(running.socket_path))
        first = rng.random((1, 64), np.float32)
        body, header_length = encode_request({"input": first})
        assert header_length is not None
        reference = _infer(sock, body, header_length)  # the first: its header is parsed and remembered
        second = rng.random((1, 64), np.float32)
        repeat, _ = encode_request({"input": second})
        calls.recording = True
        answer = _infer(sock, repeat, header_length)
        calls.recording = False
    assert answer.shape == reference.shape == (1, 10) and not np.array_equal(answer, reference)
    python = calls.python
    assert python["onnxruntime.py:run"] == 1, "the model did not run on the loop thread: a thread hop"
    assert python["queue_policy.py:push"] == 0, "a lone request on an idle model went through the queue"
    assert python["codec.py:_decode"] == 0, "a header seen before was parsed again"
    assert python["validation.py:_check"] == 0, "the engine's quick input check missed (dtype identity)"
    assert python["onnxruntime_inference_collection.py:run"] == 0, "ORT's Python wrapper ran"
    # the first request's layout was bound (edged.backends._ort_binding): this one runs through the binding
    ort_calls = sorted(name.rsplit(".", 1)[-1] for name in calls.builtin if name.endswith(("run", "iobinding")))
    assert ort_calls == ["run_with_iobinding"], ort_calls
    # the default version's cached choice is taken in InferenceService.submit, and the header seen before goes
    # from its kept layout to the engine's request with no DecodedRequest between
    assert python["registry.py:resolve"] == 0, "the model version was looked up through Registry.resolve"
    assert python["<string>:__init__"] == 1, "more than the response was built by a dataclass __init__"
    # uvloop's transport.write is compiled and invisible to the hook; the response is built and handed to it
    # once (Connection.respond joins nothing for a single-part response)
    assert python["_responder.py:respond"] == 1 and calls.builtin["lock.__exit__"] <= 3
    assert python["_http.py:on_message_begin"] == 0, "a head repeated on the connection was parsed again"
    assert python["codec.py:encode_response"] == 0, "a repeated response layout was encoded again"
    assert python["batch_execution.py:_execute_batch"] == 0, "a lone request took the batch path"
    # the scheduler is split in three modules (batch_execution, worker_pool, scheduler): a lone request's engine
    # path stays two straight calls, with no hop into the queue's or the workers' side
    engine = sorted(name for name in python if name.split(":")[0] in _SCHEDULER_MODULES)
    assert engine == ["scheduler.py:_run_alone", "scheduler.py:submit_one"], engine
    # All of it, as a ceiling: dd4723b made 73 Python calls here, 833ddca 48, 12f6c68 23, 45584a1 21, this 19. A weak
    # reference's callback runs on whichever thread a collection happens on, so it is not the request's own work.
    own = {name: count for name, count in python.items() if not name.startswith(("weakref.py:", "_weakrefset.py:"))}
    assert sum(own.values()) <= 19, sorted(python.items())


def test_the_profile_hook_sees_the_loop_thread() -> None:
    # The counts above mean something only if a hook set with threading.setprofile reaches new threads.
    seen: list[int] = []
    hook = lambda frame, event, arg: seen.append(threading.get_ident())  # noqa: E731
    threading.setprofile(hook)
    try:
        thread = threading.Thread(target=sys.getprofile)
        thread.start()
        thread.join()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    assert thread.ident in seen


def test_metrics_are_rendered_off_the_loop(counted: tuple[RunningServer, LoopCalls]) -> None:
    """/metrics renders a family per model version (thousands of lines with hundreds of models; 3000 models held
    the loop for half a second): that part runs off the loop thread, which every other client and the watchdog
    share. Counted, not timed: the engine's render is not called on the loop thread at all."""
    running, calls = counted
    calls.python.clear()
    calls.recording = True
    try:
        status, _, body = running.request("GET", "/metrics")
    finally:
        calls.recording = False
    assert status == 200
    assert b'nv_inference_count{model="tiny_mlp",version="1"}' in body
    assert b"edged_request_duration_seconds_bucket" in body
    on_loop = {name for name in calls.python if name.startswith("_metrics.py:")}
    assert not on_loop, f"the engine's metrics were rendered on the loop thread: {sorted(on_loop)}"
