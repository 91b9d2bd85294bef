"""Stopping the daemon with a gRPC call in flight: the connection gets GOAWAY (NO_ERROR, naming the last stream
it will answer), the call in flight is still answered, then the connection closes and the daemon exits."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from h2_raw import DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, RawH2, frame, message, request_block
from integration.edged_daemon import config_with_fakes, start_daemon

from edged.grpcapi.proto import grpc_service_pb2 as pb


def test_stop_sends_goaway_and_answers_the_call_in_flight(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, config=config_with_fakes("[server]\ngrpc_port = 0\n"),
                          args=["--model-control-mode", "explicit"])
    try:
        client_ = daemon.client()
        client_.load("tiny_mlp")
        tcp = next(address for address in client_.status()["grpc_listeners"] if not address.startswith("unix:"))
        request = pb.ModelInferRequest(model_name="tiny_mlp")
        request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
        request.raw_input_contents.append(np.ones(64, np.float32).tobytes())
        with RawH2(tcp) as client:
            client.start()
            client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelInfer")))  # the body comes later
            client.call(3, "ServerLive", b"")  # stream 1 is open on the server now
            daemon.process.terminate()
            goaway = client.until(GOAWAY)
            assert goaway.code == 0 and struct.unpack_from(">I", goaway.payload)[0] == 3
            client.send(frame(DATA, END_STREAM, 1, message(request.SerializeToString())))
            fields, body = client.response(1)
            assert fields[b"grpc-status"] == b"0"
            assert list(pb.ModelInferResponse.FromString(body).outputs[0].shape) == [1, 10]
            assert client.read() is None  # then the server closes the connection
        assert daemon.process.wait(60) == 0
    finally:
        daemon.stop()
