"""StopText, the cut at the first stop string of a streamed generation, against the plain definition: whatever
pieces the text comes in, what it lets out is what it would let out were the text generated one character at a
time (up to where the first stop to be completed starts), and nothing is let out that could still be the start
of one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edged.engine.generation import StopText

ALPHABET = "ab~ "


def _reference(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """As generated one character at a time: the text stops where a stop first ends (the longest of those ending
    there), and what is let out is the text before it."""
    for end in range(1, len(text) + 1):
        ending = [len(stop) for stop in stops if text[:end].endswith(stop)]
        if ending:
            return text[:end - max(ending)], True
    return text, False


@st.composite
def _streams(draw: st.DrawFn) -> tuple[list[str], tuple[str, ...]]:
    """A text cut into pieces, and stops of which most are taken from the text itself (so that they occur)."""
    text = draw(st.text(ALPHABET, max_size=30))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=10)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    stops = []
    for _ in range(draw(st.integers(1, 3))):
        if text and draw(st.booleans()):
            start = draw(st.integers(0, len(text) - 1))
            stops.append(text[start:start + draw(st.integers(1, 5))])
        else:
            stops.append(draw(st.text(ALPHABET, min_size=1, max_size=5)))
    return pieces, tuple(stops)


@given(_streams())
def test_pieces_give_what_the_whole_text_gives(stream: tuple[list[str], tuple[str, ...]]) -> None:
    pieces, stops = stream
    cut = StopText(stops)
    out, stopped = [], False
    for piece in pieces:
        released, stopped = cut.feed(piece)
        out.append(released)
        if stopped:
            break
    if not stopped:
        out.append(cut.flush())
    assert ("".join(out), stopped) == _reference("".join(pieces), stops)


def test_a_stop_longer_than_the_text_so_far_is_held_back_one_character_at_a_time() -> None:
    cut = StopText(("abcd",))
    released = [cut.feed(char) for char in "xxabc"]
    assert "".join(text for text, _ in released) == "xx"  # "abc" is held: it could still become "abcd"
    assert cut.feed("d") == ("", True)
