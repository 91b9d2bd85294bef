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
    # once: the line read 'edged bench: error: edged bench: the duration ...'
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"edged bench: error: {words}"


def test_a_scenario_file_that_cannot_be_read_names_it_and_why_once(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "nope.toml"
    assert main(["bench", "--scenarios", str(missing)]) != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"edged bench: error: cannot read scenario file {missing}: No such file or directory", last


def test_a_scenario_file_nested_past_the_parsers_depth_is_a_config_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """tomllib raised RecursionError on an array nested 100000 deep: edged bench --scenarios ended in a traceback."""
    from edged.bench import load_scenarios
    from edged.errors import ConfigError

    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_scenarios(path)
