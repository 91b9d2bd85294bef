"""HPACK's Huffman code (RFC 7541 Appendix B) and a decoder driven by one table lookup per input byte.

The decoder walks the code's binary tree a whole byte at a time, as nghttp2 does by nibbles: a state is an
internal node of the tree (the bits read since the last emitted symbol), and ``_transitions()`` maps every
(state, byte) pair to the next state and the symbols completed on the way. The table (256 states x 256 bytes,
about 2 MB) is built from ``CODES`` on the first Huffman-coded string (tens of milliseconds), not at import.
A string is accepted only if it never reaches EOS and ends at the root or on padding of at most 7 one-bits
(RFC 7541 §5.2); anything else raises `HuffmanError`.
"""

from __future__ import annotations

import functools

# RFC 7541 Appendix B: (code, bit length) for the byte values 0-255, then EOS (256), codes aligned to the LSB.
CODES: tuple[tuple[int, int], ...] = (
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28), (0xfffffe4, 28), (0xfffffe5, 28),
    (0xfffffe6, 28), (0xfffffe7, 28), (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28), (0xfffffed, 28), (0xfffffee, 28),
    (0xfffffef, 28), (0xffffff0, 28), (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28), (0xffffff8, 28), (0xffffff9, 28),
    (0xffffffa, 28), (0xffffffb, 28), (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11), (0x3fa, 10), (0x3fb, 10),
    (0xf9, 8), (0x7fb, 11), (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6), (0x1a, 6), (0x1b, 6),
    (0x1c, 6), (0x1d, 6), (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10), (0x1ffa, 13), (0x21, 6),
    (0x5d, 7), (0x5e, 7), (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7), (0x67, 7), (0x68, 7),
    (0x69, 7), (0x6a, 7), (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7), (0xfc, 8), (0x73, 7),
    (0xfd, 8), (0x1ffb, 13), (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5), (0x24, 6), (0x5, 5),
    (0x25, 6), (0x26, 6), (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5), (0x2b, 6), (0x76, 7),
    (0x2c, 6), (0x8, 5), (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15), (0x7fc, 11), (0x3ffd, 14),
    (0x1ffd, 13), (0xffffffc, 28), (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23), (0x3fffd6, 22), (0x7fffda, 23),
    (0x7fffdb, 23), (0x7fffdc, 23), (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23), (0xffffee, 24), (0x7fffe1, 23),
    (0x7fffe2, 23), (0x7fffe3, 23), (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24), (0x3fffda, 22), (0x1fffdd, 21),
    (0xfffe9, 20), (0x3fffdb, 22), (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24), (0x1fffdf, 21), (0x3fffdf, 22),
    (0x7fffeb, 23), (0x7fffec, 23), (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23), (0xfffea, 20), (0x3fffe2, 22),
    (0x3fffe3, 22), (0x3fffe4, 22), (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19), (0x3fffe7, 22), (0x7ffff2, 23),
    (0x3fffe8, 22), (0x1ffffec, 25), (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25), (0x7fff2, 19), (0x1fffe3, 21),
    (0x3ffffe6, 26), (0x7ffffe0, 27), (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26), (0xffffffd, 28), (0x7ffffe3, 27),
    (0x7ffffe4, 27), (0x7ffffe5, 27), (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23), (0x3fffea, 22), (0x3fffeb, 22),
    (0x1ffffee, 25), (0x1ffffef, 25), (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26), (0x7ffffe7, 27), (0x7ffffe8, 27),
    (0x7ffffe9, 27), (0x7ffffea, 27), (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26), (0x3fffffff, 30),
)
EOS = 256
_FAIL = -1


class HuffmanError(ValueError):
    """A Huffman-coded string is malformed: it contains EOS or its padding is not 1-7 one-bits."""


@functools.lru_cache(maxsize=1)
def _tree() -> tuple[list[list[int]], list[bool]]:
    """Internal nodes as [child for bit 0, child for bit 1] (a child >= 0 is a node, ~symbol is a leaf), and
    for each node whether it may end a string: the root, or a path of at most 7 one-bits (EOS's prefix)."""
    nodes: list[list[int]] = [[0, 0]]
    filled: list[list[bool]] = [[False, False]]
    for symbol, (code, length) in enumerate(CODES):
        node = 0
        for shift in range(length - 1, 0, -1):
            bit = (code >> shift) & 1
            if not filled[node][bit]:
                nodes.append([0, 0])
                filled.append([False, False])
                nodes[node][bit] = len(nodes) - 1
                filled[node][bit] = True
            node = nodes[node][bit]
        nodes[node][code & 1] = ~symbol
        filled[node][code & 1] = True
    accepting = [False] * len(nodes)
    node = 0
    for _ in range(8):
        accepting[node] = True
        node = nodes[node][1]
    return nodes, accepting


def _nibble_steps(nodes: list[list[int]]) -> list[tuple[int, bytes]]:
    """For index ``state << 4 | nibble``: (next state or ``_FAIL``, bytes emitted), by walking the tree."""
    steps: list[tuple[int, bytes]] = []
    for state in range(len(nodes)):
        for nibble in range(16):
            node, out = state, bytearray()
            for shift in (3, 2, 1, 0):
                child = nodes[node][(nibble >> shift) & 1]
                if child >= 0:
                    node = child
                elif ~child == EOS:
                    node = _FAIL
                    break
                else:
                    out.append(~child)
                    node = 0
            steps.append((node, bytes(out)))
    return steps


@functools.lru_cache(maxsize=1)
def _transitions() -> tuple[list[int], list[bytes], list[bool], int]:
    """For index ``state | byte``, states kept shifted left by 8: the next state and the bytes emitted, composed
    from two nibble steps (a sixteenth of the work of walking every byte bit by bit). Decoding EOS leads to a
    sink state (the last) that never leaves and never accepts, so the loop needs no test per byte."""
    nodes, accepting = _tree()
    steps = _nibble_steps(nodes)
    sink = len(nodes)
    shifted = [state << 8 for state in range(sink + 1)]  # one int object per state, shared by the table
    interned: dict[bytes, bytes] = {}
    next_state: list[int] = []
    emitted: list[bytes] = []
    for state in range(sink):
        for high in range(16):
            middle, first = steps[state << 4 | high]
            for low in range(16):
                node, second = steps[middle << 4 | low] if middle >= 0 else (_FAIL, b"")
                next_state.append(shifted[sink if node < 0 else node])
                out = first + second
                emitted.append(interned.setdefault(out, out))
    next_state.extend([shifted[sink]] * 256)
    emitted.extend([b""] * 256)
    return next_state, emitted, [*accepting, False], shifted[sink]


def decode(data: bytes | memoryview) -> bytes:
    """The bytes a Huffman-coded string stands for; `HuffmanError` if it is malformed."""
    next_state, emitted, accepting, sink = _transitions()
    state = 0
    out = []
    for byte in data:
        index = state | byte
        state = next_state[index]
        out.append(emitted[index])
    if state == sink:
        raise HuffmanError("Huffman-coded string contains EOS")
    if not accepting[state >> 8]:
        raise HuffmanError("Huffman-coded string ends with padding that is not 1-7 one-bits (EOS's prefix)")
    return b"".join(out)


def encode(data: bytes) -> bytes:
    """``data`` Huffman-coded, padded with one-bits to a whole byte (for tests and peers that want it)."""
    acc = 0
    bits = 0
    for byte in data:
        code, length = CODES[byte]
        acc = acc << length | code
        bits += length
    pad = -bits % 8
    acc = acc << pad | ((1 << pad) - 1)
    return acc.to_bytes((bits + pad) // 8, "big")
