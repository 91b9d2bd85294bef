"""One typed, frozen configuration tree, read once from TOML; each part receives only its own section."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.config._identity import MACHINE_ID, DeviceIdentity, resolve_device_identity
from edged.config._loader import build
from edged.config._memory import MemoryConfig
from edged.config._misc import LoggingConfig, OtaConfig
from edged.config._models import ModelsConfig
from edged.config._mqtt import MqttConfig, OutboxConfig, PipelineConfig
from edged.config._paths import resolve_state_dir
from edged.config._server import AccessConfig, ServerConfig
from edged.config._tcp_restricted import TCP_CATEGORIES, check_tcp_restricted, parse_restriction
from edged.config._telemetry import TelemetryConfig
from edged.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - JetPack 6 ships Python 3.10
    import tomli as tomllib

__all__ = [
    "CONFIG_VERSION", "DEFAULT_CONFIG_PATH", "MACHINE_ID", "TCP_CATEGORIES", "AccessConfig", "DeviceIdentity",
    "EdgedConfig", "LoggingConfig", "MemoryConfig", "ModelsConfig", "MqttConfig", "OtaConfig", "OutboxConfig",
    "PipelineConfig", "ServerConfig", "TelemetryConfig", "check_tcp_restricted", "load_config", "parse_config",
    "parse_restriction", "resolve_device_identity", "resolve_state_dir", "with_overrides",
]

DEFAULT_CONFIG_PATH = Path("/etc/edged/edged.toml")
# The config format this edged writes and reads strictly. Raise it whenever a release adds a key: a file
# declaring a newer version was written for a newer release, and this one (after a rollback) skips the keys
# it does not know with a warning instead of refusing to start. Version 2 added [ota] release_health_s and
# release_work_dir.
CONFIG_VERSION = 2
log = logging.getLogger(__name__)
# tomllib's messages quote an offending character, which may be one of a secret's: the repr ('x' or "'")
_QUOTED_CHARACTER = re.compile(r"character (?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")


def _config_version(value: int) -> str | None:
    return None if value >= 1 else "expected a config format version of at least 1"


@dataclass(frozen=True)
class EdgedConfig:
    # the format the file is written for; an older edged skips (with a warning) the keys it does not know
    config_version: int = field(default=CONFIG_VERSION, metadata={"check": _config_version})
    state_dir: str | None = None  # None: $STATE_DIRECTORY, then $XDG_STATE_HOME/edged, ~/.local/state/edged
    server: ServerConfig = ServerConfig()
    models: ModelsConfig = ModelsConfig()
    memory: MemoryConfig = MemoryConfig()
    mqtt: MqttConfig = MqttConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    ota: OtaConfig = OtaConfig()
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    source: str | None = field(default=None, metadata={"internal": True})  # the file it was read from, for messages


def parse_config(text: str, source: str = "<config>", *, supported: int = CONFIG_VERSION) -> EdgedConfig:
    """Parse TOML text into the config tree; errors name the file and the key path. A file whose
    ``config_version`` is above ``supported`` has its unknown keys skipped with a warning each."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # from None: the parser's own error may quote a character of a secret value; ours names only the place
        raise ConfigError(f"{source}: not valid TOML: {_without_quoted_characters(str(e))}") from None
    except RecursionError:  # tomllib recurses per nesting level: x = [[[...]]] a hundred thousand deep
        raise ConfigError(f"{source}: not valid TOML: nested too deeply to read") from None
    declared = data.get("config_version", supported)
    ignored: list[str] | None = [] if isinstance(declared, int) and declared > supported else None
    try:
        config = build(EdgedConfig, data, ignored=ignored)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from e
    for key in ignored or ():
        log.warning("%s: key %s is not known to this edged (config version %d, the file is written for %s): "
                    "ignored", source, key, supported, declared)
    return dataclasses.replace(config, source=source)


def load_config(path: str | os.PathLike[str] | None = None) -> EdgedConfig:
    """Read ``path``, or the default file when it exists, or return the built-in defaults."""
    if path is None:
        if not DEFAULT_CONFIG_PATH.exists():
            return EdgedConfig()
        path = DEFAULT_CONFIG_PATH
    raw = _read_regular_file(Path(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad_byte = e.start
    else:
        return parse_config(text, str(path))
    # raised outside the except block, so not even as its __context__ does the UnicodeDecodeError travel with
    # the error: it carries the whole file (API keys included), and its repr shows it
    raise ConfigError(f"{path}: the file is not UTF-8 text (byte {bad_byte}); save it as UTF-8")


def _read_regular_file(path: Path) -> bytes:
    """The file's bytes; a FIFO, device or socket is refused rather than read (opening a FIFO blocks until a
    writer comes, so the daemon would hang without a word). O_NONBLOCK opens a FIFO at once, fstat then tells."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
    try:
        mode, device = os.fstat(fd).st_mode, os.fstat(fd).st_rdev
        if stat.S_ISCHR(mode) and device == os.stat(os.devnull).st_rdev:
            return b""  # --config /dev/null: the built-in defaults, as an empty file gives
        if stat.S_ISDIR(mode):
            raise ConfigError(f"cannot read config file {path}: Is a directory")
        if not stat.S_ISREG(mode):
            raise ConfigError(f"cannot read config file {path}: not a regular file (a FIFO, device or socket); "
                              "name a TOML file")
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
    finally:
        os.close(fd)


def _without_quoted_characters(message: str) -> str:
    """tomllib's "Illegal character 'x'" and "Found invalid character 'x'" with the character left out."""
    return _QUOTED_CHARACTER.sub("character", message)


def with_overrides(config: EdgedConfig, overrides: dict[str, Any]) -> EdgedConfig:
    """Apply ``{"server.socket": "/x", ...}`` overrides (from command-line flags) with the same checks."""
    data = _to_plain(config)
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    source = data.pop("source", None)
    return dataclasses.replace(build(EdgedConfig, data), source=source)


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value
