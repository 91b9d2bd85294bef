"""`edged bench` measures for a positive duration: 0 or less is refused before anything runs (it printed a table
of zeros and exited 0, as if it had measured them)."""

from __future__ import annotations

import pytest

from edged.cli.main import main


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--duration", "0", "the duration must be more than 0 s, found 0.0"),
    ("--duration", "-1", "the duration must be more than 0 s, found -1.0"),
])
def test_a_duration_that_measures_nothing_is_refused(capsys: pytest.CaptureFixture[str], flag: str, value: str,
                                                     words: str) -> None:
    assert main(["bench", "--transport", "inproc", flag, value]) != 0
    assert words in capsys.readouterr().err
