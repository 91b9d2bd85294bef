"""A strict, schema-less parser of the protobuf text format, as used by Triton's ``config.pbtxt``.

The result is a generic tree: a `Message` is an ordered tuple of `Field` (name, value) pairs, with repeated
fields appearing once per value (``dims: [1, 2]`` and ``dims: 1 dims: 2`` give the same tree). Scalars are
``int``, ``float``, ``str`` or `Ident` (a bare identifier: an enum name, ``true``, ``inf``); what they mean is
decided by the builder, which knows the schema. Every syntax error is a ModelConfigError naming the file,
line and column. `dump` writes a tree back as text that parses to the same tree.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from edged.errors import ModelConfigError

# Deep nesting is never legitimate in a model config; the bound keeps a hostile file from exhausting the
# Python stack (a RecursionError would escape as a foreign exception).
MAX_DEPTH = 64
# No protobuf integer field is wider than 64 bits: a literal outside [-2^63, 2^64 - 1] fits no field, so it is
# refused where it is written. Checking the digits first also keeps int() away from literals past Python's
# 4300-digit conversion limit (a ValueError), and the values kept as they are (unknown fields) printable as JSON.
INT_MIN, UINT_MAX = -(2**63), 2**64 - 1
_MAX_DECIMAL_DIGITS = len(str(UINT_MAX))


@dataclass(frozen=True, slots=True)
class Ident:
    """A bare identifier used as a value: an enum name such as TYPE_FP32, or true/false/inf/nan."""

    name: str


Scalar = Ident | int | float | str


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    value: Message | Ident | int | float | str
    line: int = field(default=0, compare=False)
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Message:
    fields: tuple[Field, ...] = ()
    line: int = field(default=0, compare=False)
    column: int = field(default=0, compare=False)

    def all(self, name: str) -> list[Field]:
        return [f for f in self.fields if f.name == name]

    def names(self) -> list[str]:
        """Field names in first-seen order, each once."""
        return list(dict.fromkeys(f.name for f in self.fields))


_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\n\f\v]+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\[^\n])*"|'(?:[^'\\\n]|\\[^\n])*')
  | (?P<float>(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?|[0-9]+[eE][+-]?[0-9]+[fF]?|[0-9]+[fF])
  | (?P<int>0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<symbol>[{}<>\[\]:,;\-])
    """,
    re.VERBOSE,
)
_IDENT_CHAR = re.compile(r"[A-Za-z0-9_.]")
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))")
_SIMPLE_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, "'": 39, '"': 34,
                   "?": 63}
_FLOAT_IDENTS = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}
_CLOSE = {"{": "}", "<": ">"}


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    offset: int


class _Parser:
    def __init__(self, text: str, path: str | None) -> None:
        self.text = text
        self.path = path
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.tokens = list(self._tokenize())
        self.pos = 0

    # --- positions and errors ---------------------------------------------------------------------------
    def where(self, offset: int) -> tuple[int, int]:
        index = bisect.bisect_right(self.line_starts, offset) - 1
        return index + 1, offset - self.line_starts[index] + 1

    def error(self, message: str, offset: int | None = None) -> ModelConfigError:
        if offset is None:
            offset = self.tokens[self.pos].offset if self.pos < len(self.tokens) else len(self.text)
        line, column = self.where(offset)
        return ModelConfigError(message, self.path, line, column)

    def _tokenize(self) -> Iterator[_Token]:
        text, pos, end = self.text, 0, len(self.text)
        while pos < end:
            match = _TOKEN.match(text, pos)
            if match is None:
                raise self.error(self._bad_char_message(pos), pos)
            kind = match.lastgroup or ""
            if kind in ("int", "float") and match.end() < end and _IDENT_CHAR.match(text, match.end()):
                raise self.error(f"malformed number starting {match.group()!r}", pos)
            if kind not in ("ws", "comment"):
                yield _Token(kind, match.group(), pos)
            pos = match.end()

    def _bad_char_message(self, pos: int) -> str:
        char = self.text[pos]
        if char in "\"'":
            return "unterminated string (a string must close on the same line)"
        return f"unexpected character {char!r}"

    # --- token helpers ----------------------------------------------------------------------------------
    def peek(self) -> _Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take_symbol(self, symbol: str) -> bool:
        token = self.peek()
        if token is not None and token.kind == "symbol" and token.text == symbol:
            self.pos += 1
            return True
        return False

    def expect_symbol(self, symbol: str, context: str) -> None:
        if not self.take_symbol(symbol):
            raise self.error(f"expected {symbol!r} {context}, found {self.describe()}")

    def describe(self) -> str:
        token = self.peek()
        return "end of file" if token is None else repr(token.text)

    # --- grammar ----------------------------------------------------------------------------------------
    def parse(self) -> Message:
        fields = self.fields_until(None, 0)
        return Message(tuple(fields), 1, 1)

    def fields_until(self, close: str | None, depth: int) -> list[Field]:
        if depth > MAX_DEPTH:
            raise self.error(f"messages nested deeper than {MAX_DEPTH} levels")
        fields: list[Field] = []
        while True:
            token = self.peek()
            if token is None:
                if close is not None:
                    raise self.error(f"expected {close!r} to close the message, found end of file")
                return fields
            if close is not None and token.kind == "symbol" and token.text == close:
                self.pos += 1
                return fields
            self.field(fields, depth)
            if not self.take_symbol(","):
                self.take_symbol(";")

    def field(self, out: list[Field], depth: int) -> None:
        token = self.peek()
        if token is None or token.kind != "ident":
            raise self.error(f"expected a field name, found {self.describe()}")
        self.pos += 1
        line, column = self.where(token.offset)
        has_colon = self.take_symbol(":")
        nxt = self.peek()
        if nxt is not None and nxt.kind == "symbol" and nxt.text == "[":
            self.pos += 1
            for value in self.list_values(has_colon, token.text, depth):
                out.append(Field(token.text, value, line, column))
            return
        if nxt is not None and nxt.kind == "symbol" and nxt.text in _CLOSE:
            out.append(Field(token.text, self.message(depth), line, column))
            return
        if not has_colon:
            raise self.error(f"expected ':' after field {token.text!r}, found {self.describe()}")
        out.append(Field(token.text, self.scalar(token.text), line, column))

    def message(self, depth: int) -> Message:
        token = self.tokens[self.pos]
        self.pos += 1
        line, column = self.where(token.offset)
        return Message(tuple(self.fields_until(_CLOSE[token.text], depth + 1)), line, column)

    def list_values(self, has_colon: bool, name: str, depth: int) -> list[Scalar | Message]:
        values: list[Scalar | Message] = []
        if self.take_symbol("]"):
            return values
        while True:
            nxt = self.peek()
            if nxt is not None and nxt.kind == "symbol" and nxt.text in _CLOSE:
                values.append(self.message(depth))
            elif not has_colon:
                # Protobuf allows omitting ':' only before a message value or a list of messages.
                raise self.error(f"expected ':' before the list of scalars of field {name!r}")
            else:
                values.append(self.scalar(name))
            if self.take_symbol("]"):
                return values
            self.expect_symbol(",", f"between the values of field {name!r}")

    def scalar(self, name: str) -> Ident | int | float | str:
        token = self.peek()
        if token is None:
            raise self.error("expected a value, found end of file")
        start = token.offset
        negative = token.kind == "symbol" and token.text == "-"
        if negative:
            self.pos += 1
            token = self.peek()
            if token is None or token.kind not in ("int", "float", "ident"):
                raise self.error(f"expected a number after '-', found {self.describe()}")
        self.pos += 1
        if token.kind == "int":
            return self.integer(token, negative, name, start)
        if token.kind == "float":
            number = float(token.text.rstrip("fF"))
            return -number if negative else number
        if token.kind == "ident":
            if negative:
                special = _FLOAT_IDENTS.get(token.text.lower())
                if special is None:
                    raise self.error(f"expected a number after '-', found {token.text!r}", token.offset)
                return -special
            return Ident(token.text)
        if token.kind == "string":
            return self.strings(token)
        raise self.error(f"expected a value, found {token.text!r}", token.offset)

    def integer(self, token: _Token, negative: bool, name: str, start: int) -> int:
        text = token.text
        hexadecimal, octal = text[:2] in ("0x", "0X"), len(text) > 1 and text[0] == "0"
        value = None
        if hexadecimal or octal or len(text) <= _MAX_DECIMAL_DIGITS:
            value = int(text, 16 if hexadecimal else 8 if octal else 10)  # power-of-two bases have no digit limit
            value = -value if negative else value
        if value is None or not INT_MIN <= value <= UINT_MAX:
            shown = ("-" if negative else "") + (text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)")
            raise self.error(f"number {shown} of field {name!r} is out of range: integer fields hold at most 64 "
                             f"bits, [{INT_MIN}, {UINT_MAX}] (write a float such as 1e30 for a larger number)",
                             start)
        return value

    def strings(self, first: _Token) -> str:
        # Adjacent string literals concatenate, as in C.
        data = bytearray(self.unescape(first))
        while (nxt := self.peek()) is not None and nxt.kind == "string":
            self.pos += 1
            data += self.unescape(nxt)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.error(f"string is not valid UTF-8 ({e.reason} at byte {e.start})", first.offset) from e

    def unescape(self, token: _Token) -> bytes:
        body = token.text[1:-1]
        if "\\" not in body:
            return body.encode("utf-8")
        out = bytearray()
        last = 0
        for match in _ESCAPE.finditer(body):
            out += body[last:match.start()].encode("utf-8")
            last = match.end()
            out += self.escape_bytes(match, token.offset + 1 + match.start())
        out += body[last:].encode("utf-8")
        return bytes(out)

    def escape_bytes(self, match: re.Match[str], offset: int) -> bytes:
        octal, hexa, short_u, long_u, simple = match.groups()
        if octal is not None:
            code = int(octal, 8)
            if code > 255:
                raise self.error(f"octal escape \\{octal} is above \\377", offset)
            return bytes([code])
        if hexa is not None:
            return bytes([int(hexa, 16)])
        if short_u is not None or long_u is not None:
            code = int(short_u or long_u, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise self.error(f"escape {match.group()} is not a Unicode scalar value", offset)
            return chr(code).encode("utf-8")
        byte = _SIMPLE_ESCAPES.get(simple)
        if byte is None:
            raise self.error(f"unknown escape sequence \\{simple} (expected one of \\n \\t \\\" \\\\ "
                             "\\' \\r \\a \\b \\f \\v \\? \\NNN \\xHH \\uHHHH)", offset)
        return bytes([byte])


def parse(text: str, path: str | None = None) -> Message:
    """Parse protobuf text format into a tree; raise ModelConfigError naming path, line and column."""
    return _Parser(text, path).parse()


# --- writing -----------------------------------------------------------------------------------------------
def dump(message: Message, indent: str = "  ") -> str:
    """Write a tree as text format that `parse` turns back into an equal tree."""
    lines: list[str] = []
    _dump_fields(message, 0, indent, lines)
    return "".join(line + "\n" for line in lines)


def _dump_fields(message: Message, level: int, indent: str, lines: list[str]) -> None:
    pad = indent * level
    for item in message.fields:
        if isinstance(item.value, Message):
            lines.append(f"{pad}{item.name} {{")
            _dump_fields(item.value, level + 1, indent, lines)
            lines.append(pad + "}")
        else:
            lines.append(f"{pad}{item.name}: {format_scalar(item.value)}")


def format_scalar(value: Ident | int | float | str) -> str:
    if isinstance(value, Ident):
        return value.name
    if isinstance(value, bool):  # never produced by the parser; guard against a caller's True
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return quote(value)


def quote(text: str) -> str:
    out = ['"']
    for byte in text.encode("utf-8"):
        if byte in (34, 92):
            out.append("\\" + chr(byte))
        elif 32 <= byte < 127:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    out.append('"')
    return "".join(out)
