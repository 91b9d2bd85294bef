"""The TOML config: defaults, strict keys and values with key paths, flag overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edged.config import EdgedConfig, load_config, parse_config, with_overrides
from edged.errors import ConfigError


def test_no_file_means_built_in_defaults(tmp_path: Path) -> None:
    config = parse_config("")
    assert config.server.socket_mode == "0660" and config.models.control_mode == "none"
    assert config.mqtt.broker is None and config.telemetry.source == "auto"


@pytest.mark.parametrize(("text", "fragment"), [
    ("[server]\nsockt = 1\n", "unknown key server.sockt"),
    ("[nope]\n", "unknown key nope"),
    ("[mqtt]\nqos = 3\n", "mqtt.qos: expected a QoS of 0, 1 or 2, found 3"),
    ("[models]\ncontrol_mode = \"sometimes\"\n", "models.control_mode: expected one of 'none' | 'explicit' | 'poll'"),
    ("[server]\nhttp_port = 70000\n", "server.http_port: expected a TCP port"),
    ("[server]\nsocket_mode = \"rw\"\n", "server.socket_mode: expected an octal file mode"),
    ("[[mqtt.pipelines]]\ninput = \"a/+\"\nmodel = 3\noutput = \"b\"\n", "mqtt.pipelines[0].model: expected a string"),
    ("[[mqtt.pipelines]]\ninput = \"a\"\n", "mqtt.pipelines[0]"),
    ("[memory]\nbudget_mb = -1\n", "memory.budget_mb: expected a number >= 0"),
    ("server = [\n", "not valid TOML"),
    ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "not valid TOML: nested too deeply"),  # was RecursionError
    ("[server]\nmax_connections = 0\n", "server.max_connections: expected a positive number"),
    ("[server]\nmax_body_bytes = 2000\nmax_inflight_body_bytes = 1000\n",
     "max_inflight_body_bytes (1000) must be at least max_body_bytes (2000)"),
])
def test_bad_config_names_the_file_the_key_path_and_the_expected_form(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "/etc/edged/edged.toml")
    assert fragment in str(caught.value) and "/etc/edged/edged.toml" in str(caught.value)


def test_flags_override_the_file_with_the_same_checks(tmp_path: Path) -> None:
    path = tmp_path / "edged.toml"
    path.write_text('[server]\nsocket = "/run/a.sock"\n[models]\ncontrol_mode = "poll"\n')
    config = with_overrides(load_config(path), {"server.socket": "/run/b.sock", "mqtt.broker": "mqtt://h:1"})
    assert config.server.socket == "/run/b.sock" and config.models.control_mode == "poll"
    assert config.mqtt.broker == "mqtt://h:1" and config.source == str(path)
    with pytest.raises(ConfigError, match="expected a TCP port"):
        with_overrides(config, {"server.http_port": -2})


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml")


def test_the_shipped_default_config_is_exactly_the_defaults() -> None:
    assert isinstance(parse_config("[server]\n[models]\n[memory]\n[mqtt]\n[telemetry]\n"), EdgedConfig)


def test_source_is_not_a_key_a_file_may_set() -> None:
    """`source` is the file's own path, which edged records itself: a file setting it would be silently
    overwritten, so it is an unknown key, and no error lists it among the known ones."""
    with pytest.raises(ConfigError, match=r"edged.toml: unknown key source \(known keys here: config_version"):
        parse_config('source = "/somewhere/else.toml"\n', "edged.toml")
    with pytest.raises(ConfigError) as refused:
        parse_config("bogus = 1\n", "edged.toml")
    assert "source" not in str(refused.value)
    assert parse_config("", "edged.toml").source == "edged.toml"
    assert with_overrides(parse_config("", "edged.toml"), {"server.socket": "/x"}).source == "edged.toml"


def test_a_fifo_or_a_directory_as_config_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "edged.toml"
    os.mkfifo(fifo)  # no writer: a plain open would block for ever
    with pytest.raises(ConfigError, match=f"cannot read config file {fifo}: not a regular file"):
        load_config(fifo)
    with pytest.raises(ConfigError, match="Is a directory"):
        load_config(tmp_path)
    assert load_config(os.devnull) == EdgedConfig(source=os.devnull)  # the null device reads as an empty file
