"""HPACK decoder and encoder: RFC 7541 Appendix C, every malformation the decoder must refuse, the cache."""

from __future__ import annotations

import pytest

from edged.errors import InvalidInput
from edged.grpcapi import _huffman
from edged.grpcapi._hpack import Decoder, Encoder, HpackError, warm_up
from edged.grpcapi._huffman import encode as huffman_encode

Headers = list[tuple[bytes, bytes]]
DATE_21 = b"Mon, 21 Oct 2013 20:13:21 GMT"
DATE_22 = b"Mon, 21 Oct 2013 20:13:22 GMT"
LOCATION = b"https://www.example.com"
COOKIE = b"foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"

# RFC 7541 C.3 (without Huffman) and C.4 (the same requests with Huffman): three requests on one connection.
REQUESTS: list[tuple[Headers, Headers, int]] = [
    ([(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com")],
     [(b":authority", b"www.example.com")], 57),
    ([(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com"),
      (b"cache-control", b"no-cache")],
     [(b"cache-control", b"no-cache"), (b":authority", b"www.example.com")], 110),
    ([(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"), (b":authority", b"www.example.com"),
      (b"custom-key", b"custom-value")],
     [(b"custom-key", b"custom-value"), (b"cache-control", b"no-cache"), (b":authority", b"www.example.com")], 164),
]
C3 = ["828684410f7777772e6578616d706c652e636f6d", "828684be58086e6f2d6361636865",
      "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565"]
C4 = ["828684418cf1e3c2e5f23a6ba0ab90f4ff", "828684be5886a8eb10649cbf",
      "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"]

# RFC 7541 C.5 (without Huffman) and C.6 (with Huffman): three responses, a 256-byte table, evictions.
RESPONSES: list[tuple[Headers, Headers, int]] = [
    ([(b":status", b"302"), (b"cache-control", b"private"), (b"date", DATE_21), (b"location", LOCATION)],
     [(b"location", LOCATION), (b"date", DATE_21), (b"cache-control", b"private"), (b":status", b"302")], 222),
    ([(b":status", b"307"), (b"cache-control", b"private"), (b"date", DATE_21), (b"location", LOCATION)],
     [(b":status", b"307"), (b"location", LOCATION), (b"date", DATE_21), (b"cache-control", b"private")], 222),
    ([(b":status", b"200"), (b"cache-control", b"private"), (b"date", DATE_22), (b"location", LOCATION),
      (b"content-encoding", b"gzip"), (b"set-cookie", COOKIE)],
     [(b"set-cookie", COOKIE), (b"content-encoding", b"gzip"), (b"date", DATE_22)], 215),
]
C5 = ["4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d54"
      "6e1768747470733a2f2f7777772e6578616d706c652e636f6d",
      "4803333037c1c0bf",
      "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f3d"
      "4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b207665727369"
      "6f6e3d31"]
C6 = ["488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97c8e9ae82ae43d3",
      "4883640effc1c0bf",
      "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335dfdfcd5b3960d5af27087f"
      "3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007"]
TYPICAL_GRPC = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
                (b":authority", b"localhost:8001"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]


@pytest.mark.parametrize(("blocks", "examples", "table_size"), [
    (C3, REQUESTS, 4096), (C4, REQUESTS, 4096), (C5, RESPONSES, 256), (C6, RESPONSES, 256),
], ids=["C.3", "C.4", "C.5", "C.6"])
def test_rfc7541_appendix_c_sequences_decode_with_the_rfc_tables(
        blocks: list[str], examples: list[tuple[Headers, Headers, int]], table_size: int) -> None:
    decoder = Decoder(max_table_size=table_size)
    for block, (headers, table, size) in zip(blocks, examples, strict=True):
        assert decoder.decode(bytes.fromhex(block)) == headers
        assert decoder.table.entries() == table
        assert decoder.table.size == size


@pytest.mark.parametrize(("block", "headers", "table"), [
    ("400a637573746f6d2d6b65790d637573746f6d2d686561646572", [(b"custom-key", b"custom-header")],
     [(b"custom-key", b"custom-header")]),
    ("040c2f73616d706c652f70617468", [(b":path", b"/sample/path")], []),
    ("100870617373776f726406736563726574", [(b"password", b"secret")], []),
    ("82", [(b":method", b"GET")], []),
], ids=["C.2.1-incremental", "C.2.2-without-indexing", "C.2.3-never-indexed", "C.2.4-indexed"])
def test_rfc7541_c2_literal_representations(block: str, headers: Headers, table: Headers) -> None:
    decoder = Decoder()
    assert decoder.decode(bytes.fromhex(block)) == headers
    assert decoder.table.entries() == table
    assert decoder.table.size == sum(len(n) + len(v) + 32 for n, v in table)


def test_decode_accepts_bytearray_and_memoryview() -> None:
    block = bytes.fromhex(C3[0])
    assert Decoder().decode(bytearray(block)) == REQUESTS[0][0]
    assert Decoder().decode(memoryview(block)) == REQUESTS[0][0]


def test_hpack_error_is_an_invalid_input() -> None:
    assert issubclass(HpackError, InvalidInput)


# --- malformations: each one a named test -----------------------------------------------------------------------
def _refused(block: bytes, match: str, decoder: Decoder | None = None) -> None:
    with pytest.raises(HpackError, match=match):
        (decoder or Decoder()).decode(block)


def test_empty_block_is_an_empty_list() -> None:
    assert Decoder().decode(b"") == []


def test_truncated_integer_is_refused() -> None:
    _refused(b"\xff\x80", "integer truncated")  # index 127 + continuation that never ends


def test_truncated_string_length_is_refused() -> None:
    _refused(b"\x40\x7f", "integer truncated")  # new name whose 7-bit length continues past the end


def test_string_longer_than_the_block_is_refused_before_reading() -> None:
    _refused(b"\x40\x0acustom", "runs past the block's end")


def test_missing_value_string_is_refused() -> None:
    _refused(b"\x44", "string literal expected")  # :path name index, then nothing


def test_huge_length_prefix_on_a_tiny_block_is_refused_without_allocating() -> None:
    # A 4-gigabyte string length (just under 2^32) followed by three bytes.
    _refused(b"\x00\x7f\x80\xff\xff\xff\x0fabc", "runs past the block's end")


def test_index_zero_is_refused() -> None:
    _refused(b"\x80", "index 0")


def test_index_past_the_static_table_is_refused() -> None:
    _refused(b"\xbe", "index 62 is outside the tables")


def test_index_past_the_dynamic_table_is_refused() -> None:
    decoder = Decoder()
    decoder.decode(bytes.fromhex(C3[0]))  # one dynamic entry: index 62
    assert decoder.decode(b"\xbe") == [(b":authority", b"www.example.com")]
    _refused(b"\xbf", "index 63 is outside the tables", decoder)


def test_literal_name_index_past_the_tables_is_refused() -> None:
    _refused(b"\x7f\x03\x01a", "index 66 is outside the tables")


def test_integer_above_2_to_the_32_is_refused() -> None:
    _refused(b"\xff\xff\xff\xff\xff\x7f", "exceeds 2\\^32")


def test_integer_with_too_many_continuation_bytes_is_refused() -> None:
    _refused(b"\xff\x80\x80\x80\x80\x80\x01", "more than 5 continuation bytes")


def test_huffman_string_containing_eos_is_refused() -> None:
    # EOS is 30 one-bits: four 0xff bytes hold it and 2 bits of padding.
    _refused(b"\x04\x84\xff\xff\xff\xff", "contains EOS")


def test_huffman_padding_longer_than_7_bits_is_refused() -> None:
    _refused(b"\x04\x82" + huffman_encode(b"a") + b"\xff", "padding")


def test_huffman_padding_with_a_zero_bit_is_refused() -> None:
    # 'a' is 00011 (5 bits): padding 110 is not EOS's prefix 111.
    _refused(b"\x04\x81\x1e", "padding")


def test_huffman_string_cut_inside_a_code_is_refused() -> None:
    # '<' has the 15-bit code 0x7ffc: its first byte alone is 8 one-bits, longer than any padding may be.
    _refused(b"\x04\x81\xff", "padding")


def test_size_update_above_the_limit_is_refused() -> None:
    _refused(b"\x3f\xe2\x1f", "table size update to 4097 bytes exceeds the limit of 4096")


def test_size_update_after_a_field_is_refused() -> None:
    _refused(b"\x82\x20", "after the block's first field")


def test_size_updates_at_the_start_are_applied_in_order() -> None:
    decoder = Decoder()
    decoder.decode(bytes.fromhex(C3[0]))
    assert decoder.decode(b"\x20\x3f\xe1\x1f\x82") == [(b":method", b"GET")]  # to 0 (evicts), then to 4096
    assert decoder.table.entries() == []
    assert decoder.table.capacity == 4096


def test_lowered_limit_requires_a_size_update_in_the_next_block() -> None:
    decoder = Decoder()
    decoder.decode(b"\x82")  # cached
    decoder.max_table_size = 100
    _refused(b"\x82", "must open with a table size update", decoder)
    assert decoder.decode(b"\x3f\x45\x82") == [(b":method", b"GET")]  # update to 100
    assert decoder.decode(b"\x82") == [(b":method", b"GET")]


def test_header_list_larger_than_the_limit_is_refused() -> None:
    # One field of 10 + 60 + 32 = 102 bytes, against a limit of 100.
    block = b"\x00\x0a" + b"n" * 10 + b"\x3c" + b"v" * 60
    assert Decoder(max_header_list_size=102).decode(block) == [(b"n" * 10, b"v" * 60)]
    _refused(block, "exceeds the limit of 100", Decoder(max_header_list_size=100))


def test_header_list_limit_counts_indexed_repeats() -> None:
    decoder = Decoder()
    decoder.decode(b"\x40\x01n" + _integer(4000, 7) + b"v" * 4000)  # one 4033-byte entry at index 62
    assert len(decoder.decode(b"\xbe" * 16)) == 16  # 16 x 4033 = 64528 bytes: within 65536
    _refused(b"\xbe" * 17, "exceeds the limit of 65536", decoder)
    _refused(b"\xbe" * 17, "exceeds the limit of 65536", decoder)  # refused again, not served from the cache


def _integer(value: int, prefix_bits: int, flags: int = 0) -> bytes:
    """RFC 7541 §5.1, written out here so the tests do not lean on the encoder under test."""
    mask = (1 << prefix_bits) - 1
    if value < mask:
        return bytes((flags | value,))
    out, value = [flags | mask], value - mask
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes([*out, value])


# --- encoder ----------------------------------------------------------------------------------------------------
RESPONSE = [(b":status", b"200"), (b"content-type", b"application/grpc")]
TRAILERS = [(b"grpc-status", b"0"), (b"grpc-message", b"")]


def test_encoder_uses_the_static_index_for_status_200() -> None:
    assert Encoder().encode([(b":status", b"200")]) == b"\x88"


def test_encoder_writes_literals_without_indexing_and_without_huffman() -> None:
    block = Encoder().encode(RESPONSE)
    # content-type is static name 31: 0000 + 4-bit prefix 15 continued by 16, then a plain 16-byte string.
    assert block == b"\x88\x0f\x10\x10application/grpc"
    assert Encoder().encode([(b"grpc-status", b"0")]) == b"\x00\x0bgrpc-status\x010"


def test_encoder_output_leaves_the_peer_table_empty() -> None:
    encoder, decoder = Encoder(), Decoder()
    for headers in (RESPONSE, TRAILERS, [(b"grpc-status", b"3"), (b"grpc-message", b"bad input: x" * 20)]):
        assert decoder.decode(encoder.encode(headers)) == headers
        assert decoder.table.entries() == []


def test_encoder_signals_a_lowered_table_size_once() -> None:
    encoder, decoder = Encoder(), Decoder()
    encoder.set_max_table_size(8192)  # raised: our table stays at 4096 bytes, nothing to signal
    assert encoder.encode(RESPONSE) == b"\x88\x0f\x10\x10application/grpc"
    encoder.set_max_table_size(0)
    decoder.max_table_size = 0
    first = encoder.encode(RESPONSE)
    assert first == b"\x20" + b"\x88\x0f\x10\x10application/grpc"
    assert decoder.decode(first) == RESPONSE
    assert encoder.encode(RESPONSE) == b"\x88\x0f\x10\x10application/grpc"
    assert decoder.decode(encoder.encode(RESPONSE)) == RESPONSE


def test_table_sizes_out_of_range_are_programmer_errors() -> None:
    with pytest.raises(ValueError, match="max_table_size"):
        Decoder(max_table_size=-1)
    with pytest.raises(ValueError, match="SETTINGS_HEADER_TABLE_SIZE"):
        Encoder().set_max_table_size(1 << 32)


# --- the cache of decoded blocks --------------------------------------------------------------------------------
def test_cached_block_follows_a_change_of_the_dynamic_table() -> None:
    decoder = Decoder()
    decoder.decode(b"\x40\x01a\x011")  # a: 1 at index 62
    assert decoder.decode(b"\xbe") == [(b"a", b"1")]  # cached now
    decoder.decode(b"\x40\x01b\x012")  # b: 2 at 62, a: 1 moves to 63
    assert decoder.decode(b"\xbe") == [(b"b", b"2")]
    decoder.decode(b"\x3f\x00")  # size update to 31: evicts both
    _refused(b"\xbe", "index 62 is outside the tables", decoder)


def test_block_that_inserts_is_applied_every_time() -> None:
    decoder = Decoder()
    block = b"\x40\x01a\x011"
    decoder.decode(block)
    decoder.decode(block)
    assert decoder.table.entries() == [(b"a", b"1"), (b"a", b"1")]


def test_returned_list_is_the_callers_own() -> None:
    decoder = Decoder()
    first = decoder.decode(b"\x83\x86")
    first.append((b"x", b"y"))
    assert decoder.decode(b"\x83\x86") == [(b":method", b"POST"), (b":scheme", b"http")]


def test_cached_block_is_refused_after_the_header_list_limit_is_lowered() -> None:
    decoder = Decoder()
    assert decoder.decode(b"\x83\x86") == [(b":method", b"POST"), (b":scheme", b"http")]  # 43 + 43 bytes
    decoder.max_header_list_size = 85
    _refused(b"\x83\x86", "header list of 86 bytes exceeds the limit of 85", decoder)


def test_warm_up_builds_the_huffman_table_once() -> None:
    warm_up()
    built = _huffman._transitions()
    warm_up()
    assert _huffman._transitions() is built
    assert Decoder().decode(bytes.fromhex(C4[0])) == REQUESTS[0][0]
