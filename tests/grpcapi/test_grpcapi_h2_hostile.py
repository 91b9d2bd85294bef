"""HTTP/2-level attacks and protocol errors on edged's own gRPC server, as raw frames over a real socket to the
spawned daemon: each ends the connection (GOAWAY) or the stream (RST_STREAM) with the code RFC 9113 names,
the work the server does for it stays bounded, and a second client is served right after."""

from __future__ import annotations

import contextlib
import socket
import struct
import time

import numpy as np
import pytest
from grpcapi_daemon import MAX_MESSAGE_MB, GrpcDaemon
from h2_raw import (
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    RawH2,
    block,
    data_frames,
    frame,
    message,
    request_block,
)

from edged.grpcapi._h2_inflow import CONNECTION_DUE
from edged.grpcapi.proto import grpc_service_pb2 as pb


def _served(daemon: GrpcDaemon) -> None:
    """A second client gets an answer (the attack cost the daemon nothing it needed)."""
    with RawH2(daemon.tcp) as other:
        other.start()
        fields, body = other.call(1, "ServerLive", pb.ServerLiveRequest().SerializeToString())
        assert fields[b"grpc-status"] == b"0" and pb.ServerLiveResponse.FromString(body).live


def _infer_body() -> bytes:
    request = pb.ModelInferRequest(model_name="tiny_mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.ones(64, np.float32).tobytes())
    return request.SerializeToString()


def _window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


@pytest.mark.parametrize(("opening", "code"), [
    (b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", PROTOCOL_ERROR),
    (PREFACE + frame(PING, 0, 0, bytes(8)), PROTOCOL_ERROR),  # the first frame must be SETTINGS
    (PREFACE + frame(SETTINGS, 0, 0) + frame(DATA, 0, 1, bytes(16385)), FRAME_SIZE_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 2, request_block("ServerLive")), PROTOCOL_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0) + frame(DATA, 0, 7, b"x"), PROTOCOL_ERROR),  # DATA on an idle stream
    (PREFACE + frame(SETTINGS, 0, 0) + _window_update(0, 0), PROTOCOL_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0) + _window_update(0, (1 << 31) - 1), FLOW_CONTROL_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\xff\x7f"),
     COMPRESSION_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS | PADDED, 1, b"\x09abc"), PROTOCOL_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, 0, 0, b"\x00\x04\x80\x00\x00\x00"), FLOW_CONTROL_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0) + frame(PING, 0, 0, bytes(7)), FRAME_SIZE_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0) + frame(CONTINUATION, END_HEADERS, 1, b""), PROTOCOL_ERROR),
], ids=["http1", "no-settings", "frame-too-large", "even-stream", "data-idle", "zero-increment",
        "window-overflow", "hpack-garbage", "bad-padding", "initial-window-too-large", "short-ping",
        "stray-continuation"])
def test_a_connection_error_ends_the_connection_with_its_code(grpc_daemon: GrpcDaemon, opening: bytes,
                                                               code: int) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.send(opening)
        assert client.goaway().code == code
    _served(grpc_daemon)


def test_a_decreasing_stream_id_is_a_connection_error(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.call(5, "ServerLive", b"")
        client.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, request_block("ServerLive")))
        assert client.goaway().code == PROTOCOL_ERROR


def test_data_on_a_closed_stream_resets_that_stream_only(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.call(1, "ServerLive", b"")
        client.send(frame(DATA, 0, 1, b"late"))
        assert client.until(RST_STREAM, 1).code == STREAM_CLOSED
        fields, _ = client.call(3, "ServerLive", b"")  # the connection goes on
        assert fields[b"grpc-status"] == b"0"


@pytest.mark.parametrize(("name", "value"), [
    (b"x-note", b"a\r\nx-injected: 1"), (b"x-note", b"a\nb"), (b"x-note", b"a\x00b"), (b"x-note", b" padded"),
    (b"x-note", b"padded\t"), (b"x note", b"v"), (b"x:note", b"v"), (b"x-n\x7fote", b"v"), (b"", b"v"),
])
def test_a_field_rfc_9113_calls_malformed_resets_the_stream(grpc_daemon: GrpcDaemon, name: bytes,
                                                              value: bytes) -> None:
    # RFC 9113 8.2.1: no CR, LF or NUL in a value, no leading or trailing blank; a name only of visible
    # lowercase characters without ':'; a request with such a field is malformed (a stream error)
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ServerLive", [(name, value)])),
                    *data_frames(1, message(b"")))
        assert client.until(RST_STREAM, 1).code == PROTOCOL_ERROR
        fields, _ = client.call(3, "ServerLive", b"")  # the connection goes on
        assert fields[b"grpc-status"] == b"0"


def test_data_adding_up_to_other_than_the_content_length_resets_the_stream(grpc_daemon: GrpcDaemon) -> None:
    # RFC 9113 8.1.1 (h2spec's 8.1.2.6 cases): such a request is malformed, whether the DATA pass the
    # announced length, stop short of it, or never come; gRPC clients send no content-length
    live = message(b"")
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        cases = [(b"3", data_frames(1, live)), (b"100", data_frames(3, live)),
                 (b"2", [frame(DATA, 0, 5, live[:2]), frame(DATA, END_STREAM, 5, live[2:])]), (b"x5", []),
                 (b"5, 5", [])]
        for stream, (length, frames) in zip(range(1, 10, 2), cases, strict=True):
            client.send(frame(HEADERS, END_HEADERS, stream,
                              request_block("ServerLive", [(b"content-length", length)])), *frames)
            assert client.until(RST_STREAM, stream).code == PROTOCOL_ERROR, length
        client.send(frame(HEADERS, END_HEADERS | END_STREAM, 11,
                          request_block("ServerLive", [(b"content-length", b"5")])))
        assert client.until(RST_STREAM, 11).code == PROTOCOL_ERROR
        client.send(frame(HEADERS, END_HEADERS, 13, request_block("ServerLive", [(b"content-length", b"5")])),
                    *data_frames(13, live))
        fields, _ = client.response(13)  # the length that adds up is served, on the same connection
        assert fields[b"grpc-status"] == b"0"


def test_a_stream_that_depends_on_itself_is_a_protocol_error(grpc_daemon: GrpcDaemon) -> None:
    # RFC 9113 5.3.1 (h2spec's 5.3.1 cases): a PRIORITY frame resets its stream, and HEADERS (whose block is
    # then left undecoded) end the connection
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.send(frame(PRIORITY, 0, 1, struct.pack(">IB", 1, 16)))
        assert client.until(RST_STREAM, 1).code == PROTOCOL_ERROR
        fields, _ = client.call(3, "ServerLive", b"")  # the connection goes on
        assert fields[b"grpc-status"] == b"0"
        client.send(frame(HEADERS, END_HEADERS | END_STREAM | 0x20, 5,
                          struct.pack(">IB", 5, 16) + request_block("ServerLive")))
        assert client.goaway().code == PROTOCOL_ERROR


def test_a_stream_window_past_the_limit_resets_the_stream(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelInfer")), _window_update(1, (1 << 31) - 1))
        assert client.until(RST_STREAM, 1).code == FLOW_CONTROL_ERROR
        client.send(_window_update(3, 0))  # an idle stream: a connection error
        assert client.goaway().code == PROTOCOL_ERROR


def test_a_continuation_flood_is_cut_off_at_a_bounded_header_block(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.send(frame(HEADERS, 0, 1, request_block("ServerLive")),
                    frame(CONTINUATION, 0, 1, b"\x00" * 16384) * 64)  # a 1 MB header block, unfinished
        assert client.goaway().code == ENHANCE_YOUR_CALM
    _served(grpc_daemon)


def test_rapid_reset_is_refused_and_the_daemon_keeps_serving(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        burst = b"".join(frame(HEADERS, END_HEADERS, stream, request_block("ModelInfer")) +
                         frame(RST_STREAM, 0, stream, struct.pack(">I", 8)) for stream in range(1, 4001, 2))
        client.send(burst)
        assert client.goaway().code == ENHANCE_YOUR_CALM
    _served(grpc_daemon)


def test_a_ping_flood_from_a_client_that_does_not_read_is_cut_off(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp, receive_buffer=4096) as client:
        client.start()
        pings = frame(PING, 0, 0, bytes(8)) * 4096
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(150):  # 600,000 pings: more answers than the socket buffers hold
                client.send(pings)
        # the GOAWAY is queued behind the answers the client did not read, and the server may reset the
        # connection before they are: either way it ends (without the bound it would stay open, and time out)
        codes = set()
        while (got := client.read()) is not None:
            if got.kind == GOAWAY:
                codes.add(got.code)
        assert codes <= {ENHANCE_YOUR_CALM}
    _served(grpc_daemon)


def test_error_answers_to_a_client_that_does_not_read_are_cut_off(grpc_daemon: GrpcDaemon) -> None:
    """Each stream answered at once (trailers-only UNIMPLEMENTED) frees its slot, so MAX_STREAMS does not bound
    them: past the transport's high-water mark they count as unread control frames do."""
    path = "/inference.GRPCInferenceService/" + "X" * 1000  # an answer of about 1 KB names it
    opening = block([(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
                     (b"content-type", b"application/grpc")])
    # 16 MB of answers: four times what the socket buffers hold (the daemon's at most 4 MB: tcp_wmem), so half
    # of them cannot have gone out before the cut (64 KB over the transport's high-water mark, and 1024 more)
    count = 16_000
    with RawH2(grpc_daemon.tcp, receive_buffer=4096) as client:
        client.start()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for first in range(1, 2 * count, 2000):
                client.send(*(frame(HEADERS, END_HEADERS | END_STREAM, stream, opening)
                              for stream in range(first, min(first + 2000, 2 * count), 2)))
        # without the bound every answer is queued and the connection stays open (the read would time out)
        answered, codes = 0, set()
        while (got := client.read()) is not None:
            if got.kind == HEADERS:
                answered += 1
            elif got.kind == GOAWAY:
                codes.add(got.code)
        assert codes <= {ENHANCE_YOUR_CALM}
        assert answered < count // 2, f"{answered} answers were queued for a client that reads nothing"
    _served(grpc_daemon)


def test_a_stream_paused_by_a_full_transport_goes_on_once_the_client_reads(grpc_daemon: GrpcDaemon) -> None:
    """Windows wide open, so what stops the answers is the transport's high-water mark (pause_writing: a Unix
    socket's buffers are small and fixed); once the client reads, resume_writing lets them out again."""
    status = grpc_daemon.daemon.client().status
    request = pb.ModelInferRequest(model_name="tiny_mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.ones(64, np.float32).tobytes())
    count = 10_000  # 3 MB of requests (within the stream's window), 1 MB of answers: past the socket's buffers
    holds = status()["grpc"]["stream_holds"]
    with RawH2.unix(grpc_daemon.socket_path) as client:
        client.start(struct.pack(">HI", 4, (1 << 31) - 1))  # SETTINGS_INITIAL_WINDOW_SIZE
        client.send(_window_update(0, (1 << 31) - 1 - 65535),
                    frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")),
                    *data_frames(1, message(request.SerializeToString()) * count))
        deadline = time.monotonic() + 30  # a bound for a hang, not a measure
        while status()["grpc"]["stream_holds"] == holds:
            assert time.monotonic() < deadline, "the stream was never held by its unread answers"
            time.sleep(0.05)
        data, answers, fields = b"", 0, {}
        while not fields and (got := client.read()) is not None:
            if got.kind == DATA and got.stream == 1:
                data += got.payload
            elif got.kind == HEADERS and got.stream == 1:
                decoded = dict(client.decoder.decode(got.payload))
                fields = decoded if got.flags & END_STREAM else {}
    assert fields.get(b"grpc-status") == b"0", fields
    while data:
        length = int.from_bytes(data[1:5], "big")
        assert not pb.ModelStreamInferResponse.FromString(data[5:5 + length]).error_message
        data, answers = data[5 + length:], answers + 1
    assert answers == count


def test_a_held_stream_does_not_stall_the_connection_window_of_the_others(grpc_daemon: GrpcDaemon) -> None:
    """Stream 1 is held (its answer waits for a window the client never opens); two 6.2 MB frames on other
    streams pass half the connection's window, which must be granted back for them all the same."""
    status = grpc_daemon.daemon.client().status
    holds = status()["grpc"]["stream_holds"]
    request = pb.ModelInferRequest(model_name="camera_frame")
    request.inputs.add(name="frame", datatype="UINT8", shape=[1, 1080, 1920, 3])
    request.raw_input_contents.append(bytes(1080 * 1920 * 3))
    camera = message(request.SerializeToString())
    with RawH2(grpc_daemon.tcp) as client:
        client.start(struct.pack(">HI", 4, 0))  # SETTINGS_INITIAL_WINDOW_SIZE 0: stream windows opened one by one
        client.until(WINDOW_UPDATE, 0)  # the connection's window opened to 16 MiB at the start: not counted
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelStreamInfer")),
                    *data_frames(1, message(_infer_body()), end_stream=False))
        deadline = time.monotonic() + 30  # a bound for a hang, not a measure
        while status()["grpc"]["stream_holds"] == holds:
            assert time.monotonic() < deadline, "stream 1 was never held by its unread answer"
            time.sleep(0.05)
        granted = 0
        for stream in (3, 5):  # 12.4 MB together, within the 16 MiB the connection's window allows at once
            client.send(frame(HEADERS, END_HEADERS, stream, request_block("ModelInfer")),
                        _window_update(stream, 1 << 16), *data_frames(stream, camera))
            fields: dict[bytes, bytes] = {}
            while (got := client.read()) is not None:
                if got.kind == WINDOW_UPDATE and got.stream == 0:
                    granted += struct.unpack(">I", got.payload)[0]
                elif got.kind == HEADERS and got.stream == stream:
                    fields.update(client.decoder.decode(got.payload))
                    if got.flags & END_STREAM:
                        break
            assert fields.get(b"grpc-status") == b"0", fields
    assert granted >= CONNECTION_DUE, f"the connection's window was granted {granted} bytes while stream 1 was held"


def test_streams_beyond_the_advertised_maximum_are_refused(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        settings = client.until(SETTINGS)
        values = dict(struct.iter_unpack(">HI", settings.payload))
        limit = values[3]
        client.send(b"".join(frame(HEADERS, END_HEADERS, 2 * index + 1, request_block("ModelInfer"))
                             for index in range(limit + 1)))
        assert client.until(RST_STREAM, 2 * limit + 1).code == REFUSED_STREAM
        client.send(frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))  # one slot free again
        fields, _ = client.call(2 * limit + 3, "ServerLive", b"")
        assert fields[b"grpc-status"] == b"0"  # open streams are a bound, not an error
    _served(grpc_daemon)


def test_a_four_gigabyte_length_prefix_is_resource_exhausted_at_once(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelInfer")),
                    frame(DATA, 0, 1, b"\x00\xff\xff\xff\xff"))
        fields, _ = client.response(1)
        assert fields[b"grpc-status"] == b"8", fields
        assert str(MAX_MESSAGE_MB * 1024 * 1024).encode() in fields[b"grpc-message"]
    _served(grpc_daemon)


def test_frames_on_a_stream_we_ended_early_are_ignored(grpc_daemon: GrpcDaemon) -> None:
    """The call ends (RESOURCE_EXHAUSTED, then RST_STREAM NO_ERROR) while the client is still sending: its DATA
    and trailers in flight on that stream are dropped (RFC 9113 §5.4.2), the connection goes on."""
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelInfer")),
                    frame(DATA, 0, 1, b"\x00\xff\xff\xff\xff"))
        fields, _ = client.response(1)
        assert fields[b"grpc-status"] == b"8", fields
        assert client.until(RST_STREAM, 1).code == 0
        client.send(frame(DATA, 0, 1, b"late"), frame(HEADERS, END_HEADERS | END_STREAM, 1, block([(b"x", b"y")])))
        fields, body = client.call(3, "ServerLive", pb.ServerLiveRequest().SerializeToString())
        assert fields[b"grpc-status"] == b"0" and pb.ServerLiveResponse.FromString(body).live


def test_error_texts_quoting_the_request_are_cut_to_a_bounded_length(grpc_daemon: GrpcDaemon) -> None:
    long_name = "m" * 15_000  # a method and a model name that error texts quote (a header block of one frame)
    infer = pb.ModelInferRequest(model_name=long_name).SerializeToString()
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        unknown_method, _ = client.call(1, long_name, b"")
        unknown_model, _ = client.call(3, "ModelInfer", infer)
        client.send(frame(HEADERS, END_HEADERS, 5, request_block("ModelStreamInfer")),
                    *data_frames(5, message(infer)))
        _, data = client.response(5)
    assert unknown_method[b"grpc-status"] == b"12" and unknown_model[b"grpc-status"] == b"5"
    streamed = pb.ModelStreamInferResponse.FromString(data)  # the one answer: its error
    for text in (unknown_method[b"grpc-message"], unknown_model[b"grpc-message"], streamed.error_message.encode()):
        assert b"mmmm" in text and len(text) < 4096 and text.endswith(b"characters, cut)"), text[-80:]


def test_a_compressed_message_is_unimplemented(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ServerLive", [(b"grpc-encoding", b"gzip")])),
                    frame(DATA, END_STREAM, 1, b"\x01\x00\x00\x00\x00"))
        fields, _ = client.response(1)
        assert fields[b"grpc-status"] == b"12" and b"gzip" in fields[b"grpc-message"]
        # gRPC's compression spec: the UNIMPLEMENTED answer names the encodings the server accepts
        assert fields[b"grpc-accept-encoding"] == b"identity"
        # the compressed flag on a call that declares no encoding (identity) is the client's protocol error
        for stream, extra in ((3, []), (5, [(b"grpc-encoding", b"identity")])):
            client.send(frame(HEADERS, END_HEADERS, stream, request_block("ServerLive", extra)),
                        frame(DATA, END_STREAM, stream, b"\x01\x00\x00\x00\x00"))
            fields, _ = client.response(stream)
            assert fields[b"grpc-status"] == b"13", fields
            assert b"compressed flag" in fields[b"grpc-message"] and b"grpc-accept-encoding" not in fields


def test_an_unknown_method_is_unimplemented_a_bad_content_type_is_415_and_get_is_405_with_allow(
        grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        fields, _ = client.call(1, "NoSuchMethod", b"")
        assert fields[b"grpc-status"] == b"12"
        client.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, request_block(
            "ServerLive").replace(b"application/grpc", b"text/plain/xxxxx")))
        fields, _ = client.response(3)
        assert fields[b":status"] == b"415"
        client.send(frame(HEADERS, END_HEADERS | END_STREAM, 5, block([
            (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ServerLive"),
            (b":authority", b"edged"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])))
        fields, _ = client.response(5)
        assert fields[b":status"] == b"405" and fields[b"allow"] == b"POST"  # RFC 9110 15.5.6: Allow is a MUST


def test_the_response_waits_for_the_clients_window_and_honours_a_new_initial_window(
        grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start(settings=struct.pack(">HI", 4, 16))  # INITIAL_WINDOW_SIZE 16 bytes
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelInfer")),
                    frame(DATA, END_STREAM, 1, message(_infer_body())))
        received = b""
        while len(received) < 16:
            got = client.read()
            assert got is not None and not (got.stream == 1 and got.flags & END_STREAM)
            if got.kind == DATA:
                received += got.payload
        client.send(frame(PING, 0, 0, b"barrier!"))  # answered after anything the server had to send
        while (got := client.read()) is not None and got.kind != PING:
            assert got.kind != DATA, "DATA beyond the client's stream window"
        assert len(received) == 16
        client.send(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 20)))  # the window grows mid-connection
        fields, body = client.response(1, received)
        answer = pb.ModelInferResponse.FromString(body)
        assert fields[b"grpc-status"] == b"0" and list(answer.outputs[0].shape) == [1, 10]


def test_a_client_that_never_reads_holds_only_its_window_and_others_are_served(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp, receive_buffer=4096) as stalled:
        stalled.start()
        body = message(_infer_body())
        stalled.send(b"".join(frame(HEADERS, END_HEADERS, stream, request_block("ModelInfer")) +
                              frame(DATA, END_STREAM, stream, body) for stream in range(1, 255, 2)))
        _served(grpc_daemon)
        fields, _ = stalled.response(1)  # it can still read its answers later
        assert fields[b"grpc-status"] == b"0"


def test_a_client_sending_one_byte_at_a_time_is_served(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one segment per byte
        opening = (PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, request_block("ModelInfer"))
                   + frame(DATA, END_STREAM, 1, message(_infer_body())))
        for index in range(len(opening)):
            client.send(opening[index:index + 1])
        fields, body = client.response(1)
        assert fields[b"grpc-status"] == b"0"
        assert list(pb.ModelInferResponse.FromString(body).outputs[0].shape) == [1, 10]


def test_grpc_timeout_is_a_deadline(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelInfer", [(b"grpc-timeout", b"50m")])))
        fields, _ = client.response(1)  # the body never comes: the deadline ends the call
        assert fields[b"grpc-status"] == b"4" and b"deadline" in fields[b"grpc-message"]
        client.send(frame(HEADERS, END_HEADERS, 3, request_block("ModelInfer", [(b"grpc-timeout", b"5x")])))
        assert client.until(RST_STREAM, 3).code == PROTOCOL_ERROR  # not a timeout a client may send


def test_a_deadline_already_past_when_the_message_arrives_is_not_run(grpc_daemon: GrpcDaemon) -> None:
    # grpc-timeout 0S or 1n: the deadline's timer fired only after the message, in the same read, had been
    # handed to the engine, so the call was answered OK (the model ran) where gRPC says DEADLINE_EXCEEDED
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        for stream, timeout in ((1, b"0S"), (3, b"1n")):
            client.send(frame(HEADERS, END_HEADERS, stream, request_block("ModelInfer", [(b"grpc-timeout", timeout)]))
                        + b"".join(data_frames(stream, message(_infer_body()))))
            fields, body = client.response(stream)
            assert fields[b"grpc-status"] == b"4" and not body, (timeout, fields)
        fields, _ = client.call(5, "ModelInfer", _infer_body())  # the connection serves on
        assert fields[b"grpc-status"] == b"0"


def test_a_call_reset_while_the_engine_works_on_it_costs_nothing_else(grpc_daemon: GrpcDaemon) -> None:
    frame_ = np.zeros((1, 1080, 1920, 3), np.uint8)  # camera_frame runs on a worker thread, not inline
    request = pb.ModelInferRequest(model_name="camera_frame")
    request.inputs.add(name="frame", datatype="UINT8", shape=frame_.shape)
    request.raw_input_contents.append(frame_.tobytes())
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        client.send(frame(HEADERS, END_HEADERS, 1, request_block("ModelInfer")),
                    *data_frames(1, message(request.SerializeToString())),
                    frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))
        fields, body_ = client.call(3, "ModelInfer", request.SerializeToString())  # the same model, next call
        assert fields[b"grpc-status"] == b"0" and pb.ModelInferResponse.FromString(body_).raw_output_contents
    _served(grpc_daemon)
    assert "Traceback" not in grpc_daemon.daemon.output()


def test_padding_priority_and_unknown_frames_are_understood(grpc_daemon: GrpcDaemon) -> None:
    with RawH2(grpc_daemon.tcp) as client:
        client.start()
        padded_block = b"\x03" + bytes(5) + request_block("ModelInfer") + b"pad"  # pad length, priority, block
        body = message(_infer_body())
        client.send(frame(0x20, 0, 0, b"an extension frame"),  # unknown type: ignored
                    frame(HEADERS, END_HEADERS | PADDED | 0x20, 1, padded_block),
                    frame(PRIORITY, 0, 1, bytes(5)),
                    frame(DATA, END_STREAM | PADDED, 1, b"\x04" + body + b"\x00" * 4))
        fields, answer = client.response(1)
        assert fields[b"grpc-status"] == b"0"
        assert list(pb.ModelInferResponse.FromString(answer).outputs[0].shape) == [1, 10]
