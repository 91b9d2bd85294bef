"""The protobuf text-format parser: every syntax feature, and the position of every kind of error."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from edged.errors import ModelConfigError
from edged.repository import Ident, Message, dump, parse

FIXTURES = Path(__file__).parent.parent / "fixtures" / "model_configs"


def values(tree: Message, name: str) -> list[object]:
    return [f.value for f in tree.all(name)]


def test_scalar_fields_with_colon_and_every_number_form() -> None:
    tree = parse("a: 1 b: -2 c: 0x1F d: 017 e: 1.5 f: -2e3 g: .5 h: 3f i: -inf j: nan k: 0")
    assert values(tree, "a") == [1]
    assert values(tree, "b") == [-2]
    assert values(tree, "c") == [31]
    assert values(tree, "d") == [15]
    assert values(tree, "e") == [1.5]
    assert values(tree, "f") == [-2000.0]
    assert values(tree, "g") == [0.5]
    assert values(tree, "h") == [3.0]
    assert values(tree, "i") == [-math.inf]
    assert values(tree, "j") == [Ident("nan")]
    assert values(tree, "k") == [0]


def test_enums_and_booleans_stay_identifiers() -> None:
    tree = parse("data_type: TYPE_FP32 kind: KIND_CPU optional: true decoupled: True")
    assert values(tree, "data_type") == [Ident("TYPE_FP32")]
    assert values(tree, "optional") == [Ident("true")]
    assert values(tree, "decoupled") == [Ident("True")]


def test_messages_with_braces_angle_brackets_and_optional_colon() -> None:
    tree = parse('a { x: 1 } b: { y: 2 } c < z: 3 > d: < w: "4" >')
    for name, inner, value in (("a", "x", 1), ("b", "y", 2), ("c", "z", 3), ("d", "w", "4")):
        message = tree.all(name)[0].value
        assert isinstance(message, Message)
        assert values(message, inner) == [value]


def test_repeated_fields_and_lists_give_the_same_tree() -> None:
    assert parse("dims: [1, 2, 3]") == parse("dims: 1 dims: 2 dims: 3")
    assert parse("input [ { name: \"a\" }, { name: \"b\" } ]") == parse('input { name: "a" } input { name: "b" }')
    assert parse("input: [{name: \"a\"}]") == parse('input { name: "a" }')
    assert values(parse("dims: []"), "dims") == []


def test_strings_quotes_escapes_and_concatenation() -> None:
    tree = parse(r"""a: "x\n\t\"\\y" b: 'it\'s' c: "\101\x42\u00e9" d: "ab" 'cd' "ef" e: "\?\a" f: "é" """)
    assert values(tree, "a") == ['x\n\t"\\y']
    assert values(tree, "b") == ["it's"]
    assert values(tree, "c") == ["ABé"]
    assert values(tree, "d") == ["abcdef"]
    assert values(tree, "e") == ["?\a"]
    assert values(tree, "f") == ["é"]


def test_comments_and_separators_are_ignored() -> None:
    text = "# header\na: 1, # trailing\nb: 2;\nc { d: 3; e: 4, }\n# end"
    tree = parse(text)
    assert [f.name for f in tree.fields] == ["a", "b", "c"]


def test_positions_are_recorded_for_fields() -> None:
    tree = parse('name: "x"\n  input {\n    dims: 3\n  }')
    field = tree.all("input")[0]
    assert (field.line, field.column) == (2, 3)
    inner = field.value
    assert isinstance(inner, Message)
    assert (inner.all("dims")[0].line, inner.all("dims")[0].column) == (3, 5)


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ('name "x"', 1, 6, "expected ':'"),
        ("a: 1\nb: @", 2, 4, "unexpected character '@'"),
        ('a: "abc', 1, 4, "unterminated string"),
        ('a: "x\ny"', 1, 4, "unterminated string"),
        ("a { b: 1", 1, 9, "expected '}'"),
        ("a < b: 1 }", 1, 10, "expected a field name"),
        ("}", 1, 1, "expected a field name"),
        ("a: ", 1, 4, "end of file"),
        ("a: [1 2]", 1, 7, "expected ','"),
        ("dims [1, 2]", 1, 7, "expected ':' before the list of scalars"),
        ("a: -x", 1, 5, "expected a number after '-'"),
        ("a: 12abc", 1, 4, "malformed number"),
        ("a: 09", 1, 4, "malformed number"),
        (r'a: "\q"', 1, 5, "unknown escape"),
        (r'a: "\777"', 1, 5, "above \\377"),
        (r'a: "\xff"', 1, 4, "not valid UTF-8"),
        ("a: {", 1, 5, "expected '}'"),
        ("a: }", 1, 4, "expected a value"),
        ("[ext]: 1", 1, 1, "expected a field name"),
    ],
)
def test_syntax_errors_name_file_line_and_column(text: str, line: int, column: int, words: str) -> None:
    with pytest.raises(ModelConfigError) as caught:
        parse(text, "models/m/config.pbtxt")
    error = caught.value
    assert (error.path, error.line, error.column) == ("models/m/config.pbtxt", line, column)
    assert words in error.reason
    assert str(error).startswith(f"models/m/config.pbtxt:{line}:{column}: ")


@pytest.mark.parametrize(("literal", "shown"), [
    ("1" + "0" * 4400, "100000000000...(4401 digits)"),  # past Python's 4300-digit int() limit
    ("0x" + "f" * 5000, "0xffffffffff...(5002 digits)"),  # parsed, then not printable as JSON
    ("18446744073709551616", "18446744073709551616"),  # 2^64
    ("-9223372036854775809", "-9223372036854775809"),  # below -2^63
    ("0" + "7" * 30, "077777777777...(31 digits)"),
])
def test_integers_outside_64_bits_name_file_line_column_and_field(literal: str, shown: str) -> None:
    with pytest.raises(ModelConfigError) as caught:
        parse(f'name: "m"\noptimization {{ z: [ 1, {literal} ] }}', "models/m/config.pbtxt")
    error = caught.value
    assert (error.path, error.line, error.column) == ("models/m/config.pbtxt", 2, 24)  # where the number begins
    assert error.reason.startswith(f"number {shown} of field 'z' is out of range: integer fields hold at most 64 bits")


def test_integers_at_the_64_bit_edges_parse() -> None:
    tree = parse("a: 18446744073709551615 b: -9223372036854775808 c: 0xffffffffffffffff d: 0" + "0" * 40)
    assert [f.value for f in tree.fields] == [2**64 - 1, -(2**63), 2**64 - 1, 0]


def test_nesting_deeper_than_the_limit_is_a_config_error() -> None:
    with pytest.raises(ModelConfigError, match="nested deeper"):
        parse("a {" * 200 + "}" * 200)


def test_dump_round_trips_a_real_config() -> None:
    tree = parse((FIXTURES / "simple_dyna_sequence.pbtxt").read_text())
    assert parse(dump(tree)) == tree


def test_dump_round_trips_awkward_scalars() -> None:
    tree = Message((
        *(parse('s: "\\0\\n\\"\\\\é\\t"').fields),
        *(parse("f: -inf g: 1e+16 h: -0.0 i: -9223372036854775808 j: TYPE_FP32").fields),
    ))
    assert parse(dump(tree)) == tree


def test_parses_a_thousand_configs_per_second() -> None:
    texts = [p.read_text() for p in sorted(FIXTURES.glob("*.pbtxt"))]
    # The CPU time of this process, not the wall clock: the suite's other worker and other builds on the machine
    # stretched the wall time past the budget (2.24 s for 1000) while the parser itself was as fast as ever.
    start = time.process_time()
    count = 0
    while count < 1000:
        for text in texts:
            parse(text)
            count += 1
    elapsed = time.process_time() - start
    # Budget of 1 ms a config, loose enough for a slow 2-core machine.
    assert elapsed < count / 1000 * 1.0 * 2, f"{count} configs took {elapsed:.2f} s"
