"""HPACK (RFC 7541) for edged's own HTTP/2 gRPC server: request header blocks in, response blocks out.

API::

    class HpackError(InvalidInput)          # any malformed block; HTTP/2 answers COMPRESSION_ERROR
    class Decoder:
        Decoder(max_table_size=4096, max_header_list_size=65536)
        decode(block) -> list[tuple[bytes, bytes]]
        max_table_size: int                 # settable: our SETTINGS_HEADER_TABLE_SIZE, once the peer ACKs it
        max_header_list_size: int           # our SETTINGS_MAX_HEADER_LIST_SIZE
    class Encoder:
        Encoder()
        encode(headers) -> bytes
        set_max_table_size(n)               # the peer's SETTINGS_HEADER_TABLE_SIZE
    warm_up()                               # builds the Huffman table now (tens of ms), e.g. at server start

Decoder guarantees:
- ``decode`` raises nothing but `HpackError` on any input: a truncated integer or string, an index that is 0
  or past the tables, Huffman-coded data with EOS or with padding that is not 1-7 one-bits, a table size update
  above ``max_table_size`` or after the block's first field, an integer above 2^32 or longer than five
  continuation bytes, a decoded list larger than ``max_header_list_size`` (name + value + 32 per field, as
  RFC 9113 counts SETTINGS_MAX_HEADER_LIST_SIZE). After an error the table is undefined: HTTP/2 makes it a
  connection error, so the connection and its Decoder go.
- Memory is bounded by the block: a string's length is checked against the bytes left before it is read, a
  Huffman string decodes to at most 8/5 of its length, and an indexed field is a reference to a table entry,
  so the list is counted against ``max_header_list_size`` once, at the block's end.
- One Decoder per connection, used from one thread (the event loop's): it keeps the connection's table.
- The never-indexed flag (§6.2.3) is not reported: edged forwards no headers, so there is no hop to protect.
- ``max_table_size`` is the limit in effect (HTTP/2's initial value is 4096, whatever we advertise, until the
  peer acknowledges our SETTINGS). Lowering it below the table's current size requires the peer to open its
  next block with a size update (§4.2); a block without one is refused.
- Fast path: the steady state of a gRPC channel is a block of indexed fields. A block that inserts nothing and
  updates no size leaves the table as it was, so its decoded list is cached by the block's bytes; any change
  of the table clears the cache, because indexes into the dynamic table then name other entries.

Encoder guarantees: static-table indexes where name and value match exactly (``:status 200`` is 8), otherwise
a literal without indexing (with the static name's index where there is one), never Huffman. So it inserts
nothing and the peer's decoder table stays empty. When the peer lowers SETTINGS_HEADER_TABLE_SIZE below the
size ours has, the next block opens with a size update to the new value: an encoder that never inserts could
skip it, but §4.2 makes the update mandatory after a reduction and strict decoders (nghttp2's) reject a block
without it; it costs a byte or two once.
"""

from __future__ import annotations

from itertools import chain
from typing import NoReturn

from edged.errors import InvalidInput
from edged.grpcapi import _huffman
from edged.grpcapi._hpack_tables import ENTRY_OVERHEAD, STATIC_COUNT, STATIC_TABLE, DynamicTable

_INITIAL_TABLE_SIZE = 4096  # RFC 9113 §6.5.2: SETTINGS_HEADER_TABLE_SIZE's initial value
_INTEGER_LIMIT = 1 << 32
_MAX_CONTINUATION_SHIFT = 35  # five continuation bytes: 35 bits, past the limit already
_CACHE_ENTRIES = 64
_CACHE_BLOCK_BYTES = 1024
_BY_INDEX: tuple[tuple[bytes, bytes] | None, ...] = (None, *STATIC_TABLE)
_STATIC_BY_INDEX: tuple[tuple[bytes, bytes], ...] = ((b"", b""), *STATIC_TABLE)  # 0 is never looked up here
_STATIC_EXACT = {entry: index for index, entry in reversed(list(enumerate(STATIC_TABLE, 1)))}
_STATIC_NAME = {name: index for index, (name, _) in reversed(list(enumerate(STATIC_TABLE, 1)))}

Header = tuple[bytes, bytes]


class HpackError(InvalidInput):
    """A header block is malformed (RFC 7541); HTTP/2 treats it as a connection error (COMPRESSION_ERROR)."""


def _check_size(what: str, n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < _INTEGER_LIMIT:
        raise ValueError(f"{what} must be an integer from 0 to 2^32-1, got {n!r}")
    return n


def _integer(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    """The integer (§5.1) whose prefix is in ``data[pos]``, and the position after it."""
    mask = (1 << prefix_bits) - 1
    value = data[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if value >= _INTEGER_LIMIT:
            raise HpackError(f"integer at offset {pos - 1} exceeds 2^32")
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= _MAX_CONTINUATION_SHIFT:
            raise HpackError(f"integer at offset {pos - 1} has more than 5 continuation bytes")
    raise HpackError(f"integer truncated at the block's end ({len(data)} bytes)")


def _string(data: bytes, pos: int) -> tuple[bytes, int]:
    """The string literal (§5.2) at ``pos``, Huffman-decoded where flagged, and the position after it."""
    if pos >= len(data):
        raise HpackError(f"string literal expected at offset {pos}, the block ends there")
    huffman = data[pos] & 0x80
    length, pos = _integer(data, pos, 7)
    end = pos + length
    if end > len(data):
        raise HpackError(f"string of {length} bytes at offset {pos} runs past the block's end ({len(data)} bytes)")
    raw = data[pos:end]
    if huffman:
        try:
            raw = _huffman.decode(raw)
        except _huffman.HuffmanError as e:
            raise HpackError(f"string at offset {pos}: {e}") from e
    return raw, end


def warm_up() -> None:
    """Builds the Huffman decoding table, which is otherwise built on the first Huffman-coded string: a server
    calls it before it listens, so no request pays for it on the event loop."""
    _huffman.decode(b"")


class Decoder:
    """Decodes the header blocks of one HTTP/2 connection's requests, in the order they arrive."""

    def __init__(self, max_table_size: int = _INITIAL_TABLE_SIZE, max_header_list_size: int = 65536) -> None:
        self._limit = _check_size("max_table_size", max_table_size)
        self.max_header_list_size = _check_size("max_header_list_size", max_header_list_size)
        self._table = DynamicTable(max_table_size)
        self._update_required = False
        self._cache: dict[bytes, tuple[tuple[Header, ...], int]] = {}

    @property
    def max_table_size(self) -> int:
        return self._limit

    @max_table_size.setter
    def max_table_size(self, n: int) -> None:
        self._limit = _check_size("max_table_size", n)
        if n < self._table.capacity:
            self._update_required = True
            self._cache.clear()  # so the next block is checked for the update

    @property
    def table(self) -> DynamicTable:
        """The dynamic table (read it, don't change it): for status and tests."""
        return self._table

    def decode(self, block: bytes | bytearray | memoryview) -> list[Header]:
        data = bytes(block)
        hit = self._cache.get(data)
        if hit is not None:
            headers, size = hit
            if size > self.max_header_list_size:
                self._check_list_size(size)
            return list(headers)
        return self._decode(data)

    def _decode(self, data: bytes) -> list[Header]:
        pos = 0
        if self._update_required or (data and data[0] & 0xE0 == 0x20):
            pos = self._size_updates(data)
        cacheable = pos == 0
        out: list[Header] = []
        static = _STATIC_BY_INDEX
        dynamic = self._table.fields
        end = len(data)
        while pos < end:
            byte = data[pos]
            if byte & 0x80:  # indexed field, the steady state: inlined, no call unless the index is long
                index = byte & 0x7F
                pos += 1
                if index == 0x7F:
                    index, pos = _integer(data, pos - 1, 7)
                if index > STATIC_COUNT:
                    try:
                        header = dynamic[index - STATIC_COUNT - 1]
                    except IndexError:
                        self._bad_index(index)
                elif index:
                    header = static[index]
                else:
                    self._bad_index(index)
            elif byte & 0x40:
                header, pos = self._literal(data, pos, 6)
                if cacheable:
                    cacheable = False
                    self._cache.clear()
                self._table.add(*header)
            elif byte & 0x20:
                raise HpackError(f"table size update at offset {pos}, after the block's first field (§4.2)")
            else:  # without indexing (0000) or never indexed (0001): both have a 4-bit prefix
                header, pos = self._literal(data, pos, 4)
            out.append(header)
        # Counted once at the end: until then the list holds references into the block and the table, so the
        # memory it takes is bounded by the block's length whatever the sizes add up to.
        size = ENTRY_OVERHEAD * len(out) + sum(map(len, chain.from_iterable(out)))
        self._check_list_size(size)
        if cacheable and end <= _CACHE_BLOCK_BYTES:
            if len(self._cache) >= _CACHE_ENTRIES:
                self._cache.clear()
            self._cache[data] = (tuple(out), size)
        return out

    def _size_updates(self, data: bytes) -> int:
        """Applies the size updates that open the block; returns the position of its first field."""
        pos = 0
        while pos < len(data) and data[pos] & 0xE0 == 0x20:
            size, pos = _integer(data, pos, 5)
            if size > self._limit:
                raise HpackError(f"table size update to {size} bytes exceeds the limit of {self._limit}")
            self._cache.clear()
            self._table.resize(size)
            self._update_required = False
        if self._update_required:
            raise HpackError(f"block must open with a table size update to at most {self._limit} bytes (§4.2)")
        return pos

    def _entry(self, index: int) -> Header:
        header = _BY_INDEX[index] if index <= STATIC_COUNT else self._table.get(index - STATIC_COUNT - 1)
        if header is None:
            self._bad_index(index)
        return header

    def _bad_index(self, index: int) -> NoReturn:
        if index == 0:
            raise HpackError("index 0 names no header field (§6.1)")
        raise HpackError(f"index {index} is outside the tables (1 to {STATIC_COUNT + len(self._table)})")

    def _literal(self, data: bytes, pos: int, prefix_bits: int) -> tuple[Header, int]:
        index, pos = _integer(data, pos, prefix_bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _string(data, pos)
        value, pos = _string(data, pos)
        return (name, value), pos

    def _check_list_size(self, size: int) -> None:
        if size > self.max_header_list_size:
            raise HpackError(f"header list of {size} bytes exceeds the limit of "
                             f"{self.max_header_list_size} (name + value + 32 per field)")


def _encode_integer(value: int, prefix_bits: int, flags: int) -> bytes:
    mask = (1 << prefix_bits) - 1
    if value < mask:
        return bytes((flags | value,))
    out = bytearray((flags | mask,))
    value -= mask
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _encode_string(value: bytes) -> bytes:
    return _encode_integer(len(value), 7, 0x00) + value


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal never indexed with a literal name (§6.2.3, no Huffman coding)."""
    return b"\x10" + _encode_string(name) + _encode_string(value)


def literal_static_name(index: int, value: bytes) -> bytes:
    """A header field as a literal never indexed whose name is the static table's entry ``index``."""
    return _encode_integer(index, 4, 0x10) + _encode_string(value)


def table_size_update(size: int) -> bytes:
    """A dynamic table size update (§6.3), due at the start of the block after the peer lowers the table."""
    return _encode_integer(size, 5, 0x20)


# The server's response head, built once: ``:status 200`` (static index 8) and content-type (static name 31).
STATUS_200 = _encode_integer(8, 7, 0x80)
CONTENT_TYPE_GRPC = literal_static_name(31, b"application/grpc")


def _encode_field(name: bytes, value: bytes) -> bytes:
    index = _STATIC_EXACT.get((name, value))
    if index is not None:
        return _encode_integer(index, 7, 0x80)
    index = _STATIC_NAME.get(name)
    if index is not None:
        return _encode_integer(index, 4, 0x00) + _encode_string(value)
    return b"\x00" + _encode_string(name) + _encode_string(value)


class Encoder:
    """Encodes the response header and trailer blocks of one HTTP/2 connection; it keeps no dynamic table."""

    def __init__(self) -> None:
        self._table_size = _INITIAL_TABLE_SIZE
        self._pending_update: int | None = None
        self._cache: dict[tuple[Header, ...], bytes] = {}

    def set_max_table_size(self, n: int) -> None:
        if _check_size("SETTINGS_HEADER_TABLE_SIZE", n) < self._table_size:
            self._table_size = n
            self._pending_update = n

    def encode(self, headers: list[Header]) -> bytes:
        key = tuple(headers)
        block = self._cache.get(key)
        if block is None:
            block = b"".join([_encode_field(name, value) for name, value in key])
            if len(block) <= _CACHE_BLOCK_BYTES:
                if len(self._cache) >= _CACHE_ENTRIES:
                    self._cache.clear()
                self._cache[key] = block
        if self._pending_update is not None:
            block = table_size_update(self._pending_update) + block
            self._pending_update = None
        return block
