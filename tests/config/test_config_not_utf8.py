"""A config file that is not UTF-8, and errors about secret values: one ConfigError naming the file and the
place, never the file's content (config errors reach the journal and the terminal), and from the CLI one error
line, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edged.config import load_config, parse_config
from edged.errors import ConfigError

SECRET = "sk-not-to-be-logged-0123456789"
# A Latin-1 "é" (0xE9) in a comment, after a secret: what an editor in a Latin-1 locale leaves behind.
NOT_UTF8 = f'[server]\nopenai_api_key = "{SECRET}"\n# caf'.encode() + b"\xe9\n"
BAD_BYTE = NOT_UTF8.index(b"\xe9")
SECRET_NUMBER = "98765432109876"  # a secret written without its quotes: an integer


def _every_message(error: BaseException) -> str:
    """The error's text with everything chained to it, as a logged traceback would show it."""
    parts = []
    seen: BaseException | None = error
    while seen is not None:
        parts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def test_a_file_that_is_not_utf8_names_the_file_and_the_byte_never_the_content(tmp_path: Path) -> None:
    path = tmp_path / "edged.toml"
    path.write_bytes(NOT_UTF8)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: the file is not UTF-8 text (byte {BAD_BYTE}); save it as UTF-8"
    assert SECRET not in _every_message(caught.value)


@pytest.mark.parametrize(("text", "fragment"), [
    (f"[server]\nopenai_api_key = {SECRET_NUMBER}\n", "server.openai_api_key: expected a string, found int"),
    (f"[server.tcp_restricted]\ninference = {SECRET_NUMBER}\n",
     "server.tcp_restricted.inference: expected a string, found int"),
    (f'[server]\nopenai_api_key = "{SECRET}\x01"\n', "not valid TOML: Illegal character (at line 2"),
])
def test_errors_about_a_secret_value_name_the_key_but_never_quote_the_value(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "edged.toml")
    assert fragment in str(caught.value)
    shown = _every_message(caught.value)
    assert SECRET not in shown and SECRET_NUMBER not in shown and "\\x01" not in str(caught.value)


def test_values_that_are_not_secret_are_still_quoted_in_errors() -> None:
    with pytest.raises(ConfigError, match=r"server.socket: expected a string, found int 5"):
        parse_config("[server]\nsocket = 5\n", "edged.toml")


@pytest.mark.parametrize("command", [["serve"], ["doctor"], ["telemetry", "summary"]])
def test_commands_given_a_file_that_is_not_utf8_print_one_error_line(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "edged.toml"
    path.write_bytes(NOT_UTF8)
    done = subprocess.run([sys.executable, "-m", "edged", *command, "--config", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and SECRET not in done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"edged {command[0]}: error: {path}: the file is not UTF-8 text (byte {BAD_BYTE}); "
        "save it as UTF-8")
