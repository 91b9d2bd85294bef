"""Command-line values that hold JSON inline or in a file named with ``@``, read the same way everywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edged.errors import ConfigError


def read_json_argument(option: str, value: str, expected: str) -> Any:
    """Parse ``value`` (inline JSON, or ``@FILE``); errors name the option and say what was ``expected``."""
    text = value
    if value.startswith("@"):
        path = value[1:]
        try:
            raw = Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"{option}: cannot read {path}: {e.strerror}") from e
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{option}: {path} is not UTF-8 text (byte {e.start}); JSON files must be "
                              "UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{option}: not JSON ({e}); expected {expected}: {text[:80]!r}") from e
    except RecursionError:  # the parser's depth: [[[...]]] a hundred thousand deep is no tensor or config
        raise ConfigError(f"{option}: JSON nested too deeply to read; expected {expected}") from None
