"""The command line as a new user meets it: usage errors name the subcommand they belong to, and every
subcommand's --help says what it does."""

from __future__ import annotations

import pytest

from edged.cli.main import COMMANDS, build_parser, main


@pytest.mark.parametrize("words", [["bench", "--bogus"], ["telemetry", "summary", "--bogus"],
                                   ["models", "list", "--bogus", "x"], ["status", "extra"]])
def test_an_unknown_flag_is_refused_with_the_subcommands_usage(words, capsys):
    """argparse reported unrecognized arguments from the top parser: 'usage: edged [-h] [--version] COMMAND'
    and 'edged: error: ...', which sends the user to the wrong help."""
    with pytest.raises(SystemExit) as raised:
        main(words)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    command = "edged " + " ".join(w for w in words if not w.startswith("-") and w not in ("x", "extra"))
    assert err.startswith(f"usage: {command} ")
    assert f"{command}: error: unrecognized arguments: " in err


def _subparsers(parser):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            yield from action.choices.items()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_help_says_what_it_does(name):
    """edged telemetry parse --help printed only 'usage: edged telemetry parse [-h]': not that it reads stdin."""
    command = dict(_subparsers(build_parser(only=name)))[name]
    parsers = [(name, command), *((f"{name} {n}", p) for n, p in _subparsers(command))]
    for label, parser in parsers:
        assert parser.description, f"edged {label} --help has no description"
        assert "``" not in parser.description, f"edged {label} --help shows reStructuredText markup"


def test_json_nested_past_the_parsers_depth_is_a_one_line_error(tmp_path, capsys):
    """json.loads raises RecursionError, not JSONDecodeError, for [[[...]]] nested 100000 deep: a traceback."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    assert main(["models", "load", "m", "--config", f"@{deep}", "--socket", str(tmp_path / "none.sock")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("edged models: error: --config: ") and "nested" in err and "Traceback" not in err
