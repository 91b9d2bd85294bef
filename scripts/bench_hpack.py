"""Microseconds per HPACK decode of a typical gRPC request block (and per response encode), side by side.

Run: PYTHONPATH=$PWD .venv/bin/python scripts/bench_hpack.py
Each figure is the best of --repeat rounds of --number calls in process CPU time, so a loaded machine inflates
them less; python-hyper's ``hpack`` (pure Python, the dev extra) decodes the same blocks in the same run as the
reference for the ratios. "+ new grpc-timeout" is a channel whose every call carries a new value (python-hyper's
encoder indexes each, so the table churns and evicts), as gRPC clients with a deadline do.
"""

from __future__ import annotations

import argparse
import time
import timeit
from collections.abc import Callable

import hpack

from edged.grpcapi._hpack import Decoder, Encoder

REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
           (b":authority", b"localhost:8001"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
           (b"user-agent", b"grpc-c++/1.x"), (b"grpc-accept-encoding", b"identity,deflate,gzip")]
RESPONSE = [(b":status", b"200"), (b"content-type", b"application/grpc")]
TRAILERS = [(b"grpc-status", b"0")]


def _us(fn: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat, timer=time.process_time)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    encoder = hpack.Encoder()
    first = encoder.encode(REQUEST, huffman=True)  # literals with indexing, Huffman-coded: a channel's first call
    steady = encoder.encode(REQUEST, huffman=True)  # all indexed: every later call
    timeout = hpack.Encoder()
    timeout_first = timeout.encode(REQUEST)
    with_timeout = [timeout.encode([*REQUEST, (b"grpc-timeout", f"{i}m".encode())])
                    for i in range(args.number * args.repeat)]  # decoded once each, in order
    ours, theirs = Decoder(), hpack.Decoder()
    ours.decode(first)
    theirs.decode(first)

    def uncached() -> None:
        ours._cache.clear()  # what a block costs when the table changed since it was last seen
        ours.decode(steady)

    blocks = iter(with_timeout)
    streaming = Decoder()
    streaming.decode(timeout_first)
    response = Encoder()
    rows = [
        ("steady block, ours (cached)", _us(lambda: ours.decode(steady), args.number, args.repeat)),
        ("steady block, ours (cache cleared)", _us(uncached, args.number, args.repeat)),
        ("steady block + new grpc-timeout, ours", _us(lambda: streaming.decode(next(blocks)), args.number,
                                                     args.repeat)),
        ("steady block, python-hyper hpack", _us(lambda: theirs.decode(steady, raw=True), args.number // 10,
                                                 args.repeat)),
        ("first block (Huffman, 8 inserts), ours", _us(lambda: Decoder().decode(first), args.number // 10,
                                                       args.repeat)),
        ("first block, python-hyper hpack", _us(lambda: hpack.Decoder().decode(first, raw=True),
                                                args.number // 10, args.repeat)),
        ("response + trailers, our Encoder (cached)", _us(lambda: (response.encode(RESPONSE),
                                                                   response.encode(TRAILERS)),
                                                          args.number, args.repeat)),
        ("response + trailers, a fresh Encoder", _us(lambda: (Encoder().encode(RESPONSE),
                                                              Encoder().encode(TRAILERS)),
                                                     args.number, args.repeat)),
    ]
    print(f"block sizes: first {len(first)} B, steady {len(steady)} B")
    for name, us in rows:
        print(f"{name:45s} {us:8.2f} µs")


if __name__ == "__main__":
    main()
