"""HPACK against python-hyper's ``hpack`` (a second implementation), and hostile input.

Our Decoder must read whatever ``hpack.Encoder`` writes (with and without Huffman, never-indexed fields,
evictions and size updates, many blocks sharing one table), ``hpack.Decoder`` must read our Encoder's blocks,
and random or mutated blocks must raise nothing but HpackError, with memory bounded by the block.
"""

from __future__ import annotations

import tracemalloc

import hpack
import pytest
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edged.grpcapi import _huffman
from edged.grpcapi._hpack import Decoder, Encoder, HpackError
from edged.grpcapi._hpack_tables import STATIC_TABLE

Headers = list[tuple[bytes, bytes]]

# Names and values the static table knows (so the encoder indexes them) mixed with arbitrary ones.
_static_names = st.sampled_from([name for name, _ in STATIC_TABLE])
_names = st.one_of(_static_names, st.binary(min_size=1, max_size=40))
_values = st.one_of(st.sampled_from([value for _, value in STATIC_TABLE]), st.binary(max_size=120))
_header = st.one_of(st.sampled_from(STATIC_TABLE), st.tuples(_names, _values))
_header_list = st.lists(_header, max_size=12)
_sequence = st.lists(st.tuples(_header_list, st.booleans(), st.lists(st.booleans(), max_size=12)),
                     min_size=1, max_size=8)
_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(blocks=_sequence, table_size=st.sampled_from([0, 64, 256, 4096]))
def test_decoder_reads_a_sequence_that_hpack_encodes(
        blocks: list[tuple[Headers, bool, list[bool]]], table_size: int) -> None:
    theirs = hpack.Encoder()
    ours = Decoder()
    theirs.header_table_size = table_size  # its next block opens with the size update
    for headers, huffman, sensitive in blocks:
        marked = [hpack.NeverIndexedHeaderTuple(n, v) if i < len(sensitive) and sensitive[i]
                  else hpack.HeaderTuple(n, v) for i, (n, v) in enumerate(headers)]
        block = theirs.encode(marked, huffman=huffman)
        assert ours.decode(block) == headers
        assert ours.table.capacity == table_size
        assert ours.table.entries() == [(bytes(n), bytes(v)) for n, v in theirs.header_table.dynamic_entries]


@_SETTINGS
@given(blocks=st.lists(_header_list, min_size=1, max_size=8), table_size=st.sampled_from([0, 100, 4096, 65536]))
def test_hpack_decodes_what_our_encoder_writes(blocks: list[Headers], table_size: int) -> None:
    ours = Encoder()
    theirs = hpack.Decoder()
    ours.set_max_table_size(table_size)
    theirs.max_allowed_table_size = table_size
    for headers in blocks:
        assert theirs.decode(ours.encode(headers), raw=True) == headers
        assert len(theirs.header_table.dynamic_entries) == 0


def _valid_blocks() -> list[bytes]:
    encoder = hpack.Encoder()
    request = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
               (b":authority", b"localhost:8001"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
               (b"grpc-timeout", b"100m"), (b"x-edged-key", b"\x00\xff" * 9)]
    return [encoder.encode(request, huffman=True), encoder.encode(request, huffman=False),
            encoder.encode([*request[:3], (b"custom", b"v" * 300)], huffman=True)]


_VALID = _valid_blocks()


def _bounded_decode(decoder: Decoder, block: bytes) -> None:
    """Decodes, allowing only HpackError, and checks the peak allocation stays a small multiple of the block."""
    tracemalloc.start()
    try:
        decoder.decode(block)
    except HpackError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 64 * 1024 + 16 * len(block)


@settings(max_examples=300, deadline=None)
@given(block=st.binary(max_size=300))
def test_random_bytes_raise_only_hpack_error_with_bounded_memory(block: bytes) -> None:
    _bounded_decode(Decoder(), block)


@settings(max_examples=300, deadline=None)
@given(which=st.integers(0, len(_VALID) - 1), flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                                              min_size=1, max_size=4),
       cut=st.integers(0, 10_000))
def test_mutated_valid_blocks_raise_only_hpack_error(which: int, flips: list[tuple[int, int]], cut: int) -> None:
    block = bytearray(_VALID[which])
    for pos, byte in flips:
        block[pos % len(block)] = byte
    _bounded_decode(Decoder(), bytes(block[: len(block) - cut % 4]))


@settings(max_examples=150, deadline=None)
@given(blocks=st.lists(st.binary(max_size=60), min_size=2, max_size=10))
def test_one_decoder_fed_random_blocks_raises_only_hpack_error(blocks: list[bytes]) -> None:
    decoder = Decoder(max_header_list_size=4096)
    for block in blocks:
        try:
            decoder.decode(block)
        except HpackError:
            return
        assert decoder.table.size <= decoder.table.capacity <= 4096


@pytest.mark.parametrize("length", [1 << 20, (1 << 32) - 1])
def test_huge_string_length_in_a_tiny_block_allocates_nothing_big(length: int) -> None:
    prefix = bytearray([0x00, 0x7F])  # literal, new name, 7-bit length continued
    rest = length - 127
    while rest >= 128:
        prefix.append(rest % 128 + 128)
        rest //= 128
    prefix.append(rest)
    with pytest.raises(HpackError, match="runs past the block's end"):
        _bounded_decode_raising(bytes(prefix) + b"abc")


def _bounded_decode_raising(block: bytes) -> None:
    tracemalloc.start()
    try:
        Decoder().decode(block)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 64 * 1024


def test_every_huffman_code_decodes_alone_and_in_a_run() -> None:
    reference = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)
    every = bytes(range(256))
    assert _huffman.decode(reference.encode(every)) == every
    assert _huffman.decode(reference.encode(every[::-1] * 3)) == every[::-1] * 3
    for byte in every:
        assert _huffman.decode(reference.encode(bytes([byte]))) == bytes([byte])
        assert _huffman.encode(bytes([byte])) == reference.encode(bytes([byte]))
