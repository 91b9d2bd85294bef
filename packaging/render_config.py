"""Render the default edged.toml that the tarball ships: every section, every key, commented, at its default.

Generated from the config dataclasses themselves (``edged.config.EdgedConfig``), so the shipped file cannot
drift from the code. A key whose default is "unset" is shown without a value, with the comment from the
dataclass that says what unset means. Usage: ``python render_config.py [SOURCE_DIR] > edged.toml``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from typing import Any, Literal

HEADER = """\
# edged configuration (TOML). Every key is shown commented out at its built-in default: uncomment a line
# to change it. Unknown keys are errors that name the key (an older release skips, with a warning, the keys of
# a newer config_version than its own). Flags of `edged serve` override this file.
# Under systemd the directories come from the unit: state in /var/lib/edged, socket in /run/edged/edged.sock.
"""

PIPELINE_EXAMPLE = """\
# A pipeline: messages on `input` (wildcards allowed) run through `model`; the result goes to `output`,
# where {1}, {2}, ... stand for the segments the input's wildcards matched.
# [[mqtt.pipelines]]
#   input = "sensors/+/frame"
#   model = "digits"
#   output = "results/{1}/digits"
#   codec = "json"
#   qos = 1
"""

_FIELD_COMMENT = re.compile(r"^\s+(\w+)\s*:[^#]*#\s*(.+)$")


def toml_value(value: Any) -> str | None:
    """The TOML spelling of a default, or None when it has none (unset)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(item) or '""' for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def field_comments(cls: type) -> dict[str, str]:
    """Trailing comments of the dataclass's field lines (``name: type = default  # comment``)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    found = (_FIELD_COMMENT.match(line) for line in source.splitlines())
    return {m.group(1): m.group(2).strip() for m in found if m}


def choices(cls: type) -> dict[str, str]:
    """``one of "a" | "b"`` for the fields typed as a Literal."""
    hints = typing.get_type_hints(cls)
    found = {name: typing.get_args(hint) for name, hint in hints.items()
             if typing.get_origin(hint) is Literal}
    return {name: "one of " + " | ".join(toml_value(a) or "" for a in args) for name, args in found.items()}


def render_section(instance: Any, path: str) -> list[str]:
    lines: list[str] = [f"[{path}]"] if path else []
    comments = {**choices(type(instance)), **field_comments(type(instance))}
    nested: list[tuple[str, Any]] = []
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if field.name == "source" and not path:
            continue  # filled in by the loader, not a setting
        if dataclasses.is_dataclass(value):
            nested.append((field.name, value))
            continue
        if field.name == "pipelines":
            continue  # an array of tables: shown as an example below
        text = toml_value(value)
        if field.name == "config_version" and not path:
            # set, not commented: the file declares the format it was written for (read by older releases
            # after a rollback, which then skip the keys they do not know)
            lines.append(f"config_version = {text}   # the config format of this release: keep it")
            continue
        line = f"# {field.name} = {text}" if text is not None else f"# {field.name} =   (unset)"
        comment = comments.get(field.name)
        lines.append(f"{line}   # {comment}" if comment else line)
    for name, value in nested:
        lines.append("")
        lines.extend(render_section(value, f"{path}.{name}" if path else name))
    return lines


def render(config: Any) -> str:
    lines = render_section(config, "")
    text = HEADER + "\n" + "\n".join(lines) + "\n"
    return text.replace("\n[mqtt.outbox]", "\n" + PIPELINE_EXAMPLE + "\n[mqtt.outbox]", 1)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        sys.path.insert(0, argv[1])
    from edged.config import EdgedConfig

    sys.stdout.write(render(EdgedConfig()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
