"""Builds frozen config dataclasses from parsed TOML, strictly.

Unknown keys and values of the wrong form are errors that name the key path (``mqtt.pipelines[2].qos``) and
the expected form. Field metadata may carry a ``check`` callable that returns an error string or None,
``internal`` for a field edged sets itself (such a key in a file is unknown), and ``secret`` for a value no error
may quote (its errors name the key and the type found, never the value: config errors reach the journal).
The one exception: with an ``ignored`` list (a file written for a newer config version, see
`edged.config.parse_config`) unknown keys are recorded there and skipped, so an older release still starts
after a rollback; known keys are checked as strictly as ever.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin

from edged.errors import ConfigError

T = TypeVar("T")


def build(cls: type[T], data: Mapping[str, Any], path: str = "", ignored: list[str] | None = None) -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys (or recording them in ``ignored``);
    ``path`` prefixes error messages."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a table, found {_describe(data)}")
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    # "internal" fields are set by edged itself (the file's own path), never by a file: a file naming one is refused
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}
    unknown = sorted(set(data) - set(fields))
    where = f"{path}." if path else ""
    if unknown and ignored is not None:
        ignored.extend(f"{where}{key}" for key in unknown)
        data = {k: v for k, v in data.items() if k in fields}
    elif unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(f"unknown key {where}{unknown[0]} (known keys here: {known})")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key_path = f"{path}.{name}" if path else name
        secret = bool(fields[name].metadata.get("secret"))
        converted = _convert(hints[name], value, key_path, ignored, secret)
        check = fields[name].metadata.get("check")
        if check is not None:
            problem = check(converted)
            if problem:
                raise ConfigError(f"{key_path}: {problem}, found {_shown(value, secret)}")
        kwargs[name] = converted
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path or 'config'}: {e}") from e


def _convert(hint: Any, value: Any, path: str, ignored: list[str] | None = None, secret: bool = False) -> Any:
    origin = get_origin(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, path, ignored, secret)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: expected {_hint_name(hint)}, "
                          f"found {_describe(value, secret)}")
    if origin is typing.Literal:
        allowed = get_args(hint)
        if value not in allowed:
            choices = " | ".join(repr(a) for a in allowed)
            raise ConfigError(f"{path}: expected one of {choices}, found {_shown(value, secret)}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, found {_describe(value, secret)}")
        (item,) = get_args(hint)[:1]
        return tuple(_convert(item, v, f"{path}[{i}]", ignored, secret) for i, v in enumerate(value))
    if origin in (dict, Mapping) or hint is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a table, found {_describe(value, secret)}")
        args = get_args(hint)
        value_hint = args[1] if len(args) == 2 else Any
        return {str(k): _convert(value_hint, v, f"{path}.{k}", ignored, secret) for k, v in value.items()}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return build(hint, value, path, ignored)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, found {_describe(value, secret)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, found {_describe(value, secret)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected a number, found {_describe(value, secret)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, found {_describe(value, secret)}")
        return value
    raise TypeError(f"unsupported config type {hint!r} at {path}")


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


def _describe(value: Any, secret: bool = False) -> str:
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "a list"
    return f"{type(value).__name__} {_shown(value, secret)}"


def _shown(value: Any, secret: bool) -> str:
    return "(a secret: the value is not shown)" if secret else repr(value)
