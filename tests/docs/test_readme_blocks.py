"""README.md's blocks that need no daemon: each is accounted for (run, checked or skipped with a reason), its
TOML parses with edged's config loader, its commands and flags are the CLI's, its pbtxt loads, and the folders it
names exist. The blocks that run against a daemon are in test_readme_run.py."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from readme_blocks import CHECKED, README, ROOT, RUN, SKIPPED, block, readme_blocks

from edged.cli.main import COMMANDS, build_parser
from edged.client import socket_candidates
from edged.config import EdgedConfig, parse_config, resolve_state_dir
from edged.serving.listeners import default_socket_path

TOML_MARKERS = [marker for marker in (*RUN, *CHECKED) if block(marker).language == "toml"]
# `key = value` in a TOML comment states that key's built-in default, unless it offers an alternative ("or x = 1")
DEFAULT_IN_COMMENT = re.compile(r"(?<!or )\b([a-z_0-9]+) = (\"[^\"]*\"|[0-9.]+|true|false)")


def test_every_readme_block_is_run_checked_or_skipped_with_a_reason() -> None:
    markers = {**RUN, **CHECKED, **SKIPPED}
    assert len(markers) == len(RUN) + len(CHECKED) + len(SKIPPED), "a marker is listed twice"
    for marker, reason in markers.items():
        block(marker)  # exactly one block contains it
        assert reason.strip(), f"no reason given for {marker!r}"
    for found in readme_blocks():
        matching = [marker for marker in markers if marker in found.text]
        assert len(matching) == 1, (f"README.md:{found.line}: the {found.language or 'plain'} block starting "
                                    f"{found.first_line!r} is matched by {matching}: list it in exactly one of "
                                    "RUN, CHECKED or SKIPPED (tests/docs/readme_blocks.py) with the reason")


@pytest.mark.parametrize("marker", TOML_MARKERS)
def test_toml_block_parses_with_edged_config_loader(marker: str) -> None:
    config = parse_config(block(marker).text, f"README.md:{block(marker).line}")
    assert isinstance(config, EdgedConfig)


def _section_defaults(default: EdgedConfig, section: str) -> object:
    value: object = default
    for part in filter(None, section.split(".")):
        value = getattr(value, part.replace("-", "_"))
    return value


@pytest.mark.parametrize("marker", TOML_MARKERS)
def test_defaults_named_in_toml_comments_are_the_built_in_defaults(marker: str) -> None:
    default = parse_config("")
    section = ""
    claims = 0
    for line in block(marker).text.splitlines():
        header = re.match(r"^\[([\w.-]+)\]", line)
        if header:
            section = header.group(1)
        _, _, comment = line.partition("#")
        for key, literal in DEFAULT_IN_COMMENT.findall(comment):
            owner = _section_defaults(default, section)
            if not hasattr(owner, key):
                continue  # prose such as "0: none", not a key of this section
            expected = parse_config(f"[{section}]\n{key} = {literal}\n" if section else f"{key} = {literal}\n")
            assert getattr(owner, key) == getattr(_section_defaults(expected, section), key), \
                f"README.md:{block(marker).line}: the comment says [{section}] {key} = {literal} by default"
            claims += 1
    if marker == "[ota]":
        assert claims >= 5, "the [ota] block's comments name jitter_s, rate_window_s, max_error_rate, ..."


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings
            if option.startswith("--") and option != "--help"}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_serve_synopsis_names_exactly_the_flags_of_serve_help() -> None:
    synopsis = block("edged serve [--config FILE]").text
    serve = _subparsers(build_parser("serve"))["serve"]
    assert set(re.findall(r"--[a-z-]+", synopsis)) == _flags(serve)
    for action in serve._actions:  # the choices shown are the parser's
        if action.choices is not None and action.option_strings:
            shown = re.search(re.escape(action.option_strings[0]) + r" ([\w|]+)\]", synopsis)
            assert shown is not None and shown.group(1).split("|") == list(action.choices), action.option_strings


def test_command_table_lists_every_subcommand_and_its_actions() -> None:
    text = README.read_text()
    table = re.findall(r"^\| `edged ([a-z-]+)([^`]*)` \|", text, re.MULTILINE)
    assert {name for name, _ in table} == set(COMMANDS), "the command table and `edged --help` differ"
    for name, rest in table:
        actions = re.match(r" ((?:[a-z-]+(?: M)?\\\|)+[a-z-]+(?: M)?)", rest)
        if actions is None:
            continue
        listed = {word.split()[0] for word in actions.group(1).split("\\|")}
        choices = set(_subparsers(_subparsers(build_parser(name))[name]))
        assert listed <= choices, f"edged {name}: the README lists {sorted(listed - choices)}, not in --help"


def test_socket_search_order_in_readme_is_the_clients() -> None:
    stated = re.search(r"Every client command finds the socket the same way \(([^)]*)\)", README.read_text())
    assert stated is not None
    environ = {"EDGED_SOCKET": "/e/edged.sock", "RUNTIME_DIRECTORY": "/r", "XDG_RUNTIME_DIR": "/x"}
    order = ["/e/edged.sock", "/r/edged.sock", "/x/edged/edged.sock", "/tmp/edged-1000/edged.sock",
             "/run/edged/edged.sock"]
    assert list(socket_candidates(None, environ, uid=1000)) == order
    assert [part.strip(" `\n") for part in stated.group(1).split(",")] == [
        "--socket", "$EDGED_SOCKET", "$RUNTIME_DIRECTORY", "$XDG_RUNTIME_DIR/edged", "/tmp/edged-$UID",
        "/run/edged"]


def _commands(text: str) -> list[list[str]]:
    joined = text.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.startswith("edged ")]


def test_fleet_commands_parse_with_edged_argument_parser() -> None:
    commands = _commands(block("edged fleet init REPO").text)
    assert len(commands) >= 8
    for words in commands:
        parser = build_parser(words[1])
        try:
            args = parser.parse_args(words[1:])
        except SystemExit as e:
            raise AssertionError(f"`{shlex.join(words)}` is refused by edged's parser") from e
        assert callable(args.handler)


def test_tool_parser_pbtxt_from_readme_loads_into_a_generative_model(tmp_path: Path) -> None:
    snippets = re.findall(r"`(parameters \{ key: [^`]*\})`", README.read_text())
    assert snippets, "the README's inline config.pbtxt parameters"
    for snippet in snippets:
        model = tmp_path / "tiny_llama"
        shutil.rmtree(model, ignore_errors=True)
        shutil.copytree(ROOT / "models" / "tiny_llama", model)
        with (model / "config.pbtxt").open("a") as config:
            config.write("\n" + snippet + "\n")
        result = subprocess.run([sys.executable, "-m", "edged", "models", "validate", "--json", str(model)],
                                capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, f"{snippet}: {result.stdout}{result.stderr}"
        key = re.search(r'key: "(\w+)"', snippet)
        assert key is not None and key.group(1) in result.stdout


def test_development_tree_names_existing_folders_and_packages() -> None:
    tree = block("one package per part").text
    folders = re.findall(r"^(\S+)/\s", tree, re.MULTILINE)
    assert folders and all((ROOT / folder).is_dir() for folder in folders), folders
    packages = re.search(r"one package per part \(see docs/architecture.md\): ([^\n]*(?:\n\s+[a-z, ]+\n)*)", tree)
    assert packages is not None
    names = [name.strip() for name in packages.group(1).replace("\n", " ").split(",") if name.strip()]
    missing = [name for name in names if not (ROOT / "edged" / name).is_dir()
               and not (ROOT / "edged" / f"{name}.py").is_file()]
    assert len(names) >= 10 and not missing, missing


def _default_comment(key: str) -> list[str]:
    text = block("state_dir = ").text.replace("\n" + " " * 38 + "# ", " ")  # a comment continued on the next line
    found = re.search(rf"^{key} = .*# default: (.*)$", text, re.MULTILINE)
    assert found is not None, key
    return [part.strip() for part in found.group(1).split(",")]


def test_state_dir_default_in_the_config_block_is_the_codes_search_order() -> None:
    names = {"/s": "$STATE_DIRECTORY", "/x/edged": "$XDG_STATE_HOME/edged", "/h/.local/state/edged":
             "~/.local/state/edged"}
    environ = {"STATE_DIRECTORY": "/s", "XDG_STATE_HOME": "/x", "HOME": "/h"}
    order = []
    for variable in ("STATE_DIRECTORY", "XDG_STATE_HOME", "HOME"):
        order.append(names[str(resolve_state_dir(None, environ))])
        environ.pop(variable)
    assert _default_comment("state_dir") == order


def test_socket_default_in_the_config_block_is_the_codes_search_order(tmp_path: Path) -> None:
    environ = {"RUNTIME_DIRECTORY": str(tmp_path / "r"), "XDG_RUNTIME_DIR": str(tmp_path / "x")}
    stated = _default_comment("socket")
    assert default_socket_path(environ) == tmp_path / "r" / "edged.sock"
    assert stated[0] == "$RUNTIME_DIRECTORY/edged.sock"
    environ.pop("RUNTIME_DIRECTORY")
    assert default_socket_path(environ) == tmp_path / "x" / "edged" / "edged.sock"
    assert stated[1:] == ["$XDG_RUNTIME_DIR/edged/edged.sock", "/tmp/edged-$UID/edged.sock"]
