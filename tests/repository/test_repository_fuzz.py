"""Property tests: any text gives a tree or a ModelConfigError, never another exception; generated trees
survive tree → text → tree."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edged.errors import ModelConfigError
from edged.repository import Field, Ident, Message, dump, parse, parse_model_config

FIXTURES = Path(__file__).parent.parent / "fixtures" / "model_configs"
REAL = [p.read_text() for p in sorted(FIXTURES.glob("*.pbtxt"))]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),  # the 64-bit range the parser takes
    st.floats(allow_nan=False, allow_infinity=False),  # inf parses back as Ident("inf") by design
    st.text(max_size=12),
    names.filter(lambda n: n.lower() not in {"inf", "infinity", "nan"}).map(Ident),
)


def messages(depth: int) -> st.SearchStrategy[Message]:
    values: st.SearchStrategy[object] = scalars if depth == 0 else st.one_of(scalars, messages(depth - 1))
    fields = st.builds(Field, names, values)
    return st.lists(fields, max_size=5).map(lambda fs: Message(tuple(fs)))


def config_or_error(text: str) -> None:
    try:
        parse_model_config(text, "fuzz/config.pbtxt", "fuzz")
    except ModelConfigError as e:
        assert e.path == "fuzz/config.pbtxt"


@SETTINGS
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_model_config_errors(text: str) -> None:
    config_or_error(text)


@SETTINGS
@given(st.text(alphabet='{}<>[]:,;-"\'#\\ \nabcTYPE_FP32 0123456789.xe', max_size=120))
def test_text_made_of_syntax_characters_raises_only_model_config_errors(text: str) -> None:
    config_or_error(text)


@SETTINGS
@given(st.sampled_from(REAL), st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=8),
       st.text(alphabet='{}<>[]:,;-"\'#0-1xTRUEfalse \n', max_size=6))
def test_mutated_real_configs_raise_only_model_config_errors(text: str, at: int, cut: int, insert: str) -> None:
    at %= len(text) + 1
    config_or_error(text[:at] + insert + text[at + cut:])


@SETTINGS
@given(messages(3))
def test_generated_trees_round_trip_through_text(tree: Message) -> None:
    assert parse(dump(tree)) == tree
