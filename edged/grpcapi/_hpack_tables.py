"""HPACK's header tables (RFC 7541 §2.3): the static table of Appendix A and a dynamic table bounded by size.

Index space (§2.3.3): 1-61 are the static entries, 62 onwards the dynamic ones, newest first. An entry costs
``len(name) + len(value) + 32`` bytes (§4.1); adding one evicts the oldest entries until it fits, and an entry
larger than the whole table empties it without being added (§4.4), which is not an error.
"""

from __future__ import annotations

from collections import deque

# RFC 7541 Appendix A, in index order from 1.
STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = (
    (b":authority", b""), (b":method", b"GET"), (b":method", b"POST"), (b":path", b"/"), (b":path", b"/index.html"),
    (b":scheme", b"http"), (b":scheme", b"https"), (b":status", b"200"), (b":status", b"204"), (b":status", b"206"),
    (b":status", b"304"), (b":status", b"400"), (b":status", b"404"), (b":status", b"500"),
    (b"accept-charset", b""), (b"accept-encoding", b"gzip, deflate"), (b"accept-language", b""),
    (b"accept-ranges", b""), (b"accept", b""), (b"access-control-allow-origin", b""), (b"age", b""),
    (b"allow", b""), (b"authorization", b""), (b"cache-control", b""), (b"content-disposition", b""),
    (b"content-encoding", b""), (b"content-language", b""), (b"content-length", b""), (b"content-location", b""),
    (b"content-range", b""), (b"content-type", b""), (b"cookie", b""), (b"date", b""), (b"etag", b""),
    (b"expect", b""), (b"expires", b""), (b"from", b""), (b"host", b""), (b"if-match", b""),
    (b"if-modified-since", b""), (b"if-none-match", b""), (b"if-range", b""), (b"if-unmodified-since", b""),
    (b"last-modified", b""), (b"link", b""), (b"location", b""), (b"max-forwards", b""),
    (b"proxy-authenticate", b""), (b"proxy-authorization", b""), (b"range", b""), (b"referer", b""),
    (b"refresh", b""), (b"retry-after", b""), (b"server", b""), (b"set-cookie", b""),
    (b"strict-transport-security", b""), (b"transfer-encoding", b""), (b"user-agent", b""), (b"vary", b""),
    (b"via", b""), (b"www-authenticate", b""),
)
STATIC_COUNT = len(STATIC_TABLE)
ENTRY_OVERHEAD = 32


def entry_size(name: bytes, value: bytes) -> int:
    return len(name) + len(value) + ENTRY_OVERHEAD


class DynamicTable:
    """The dynamic table of one direction of one connection; ``capacity`` is its current maximum size."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0
        self.fields: deque[tuple[bytes, bytes]] = deque()  # newest first; the decoder reads it, never writes

    def __len__(self) -> int:
        return len(self.fields)

    def entries(self) -> list[tuple[bytes, bytes]]:
        """Newest first, as indexes 62, 63, ... address them."""
        return list(self.fields)

    def get(self, index: int) -> tuple[bytes, bytes] | None:
        """The entry at a dynamic index counted from 0 (HPACK index 62), or None past the end."""
        if index < len(self.fields):
            return self.fields[index]
        return None

    def add(self, name: bytes, value: bytes) -> None:
        size = entry_size(name, value)
        if size > self.capacity:
            self.fields.clear()
            self.size = 0
            return
        self._evict(self.capacity - size)
        self.fields.appendleft((name, value))
        self.size += size

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        self._evict(capacity)

    def _evict(self, room: int) -> None:
        while self.size > room:
            name, value = self.fields.pop()
            self.size -= entry_size(name, value)
