"""``config_version``: a file written for a newer release still starts an older one (after a release rollback),
while a file of this release's own version keeps refusing every unknown key."""

from __future__ import annotations

import logging

import pytest

from edged.config import CONFIG_VERSION, EdgedConfig, parse_config
from edged.errors import ConfigError

# What a newer release might write: a key in a known section, a whole new section, a new key in a list entry.
NEWER = f"""config_version = {CONFIG_VERSION + 1}
[server]
socket = "/run/edged/x.sock"
tcp_fast_open = true
[ota]
enabled = false
release_canary = "night"
[fleet_sim]
devices = 3
[[mqtt.pipelines]]
input = "a/+"
model = "m"
output = "b/{{1}}"
priority = 5
"""


def test_the_older_parser_accepts_a_config_written_for_a_newer_release(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edged.config"):
        config = parse_config(NEWER, "edged.toml")
    assert config.server.socket == "/run/edged/x.sock"  # the keys it knows are read
    assert config.mqtt.pipelines[0].model == "m"
    warned = " ".join(r.getMessage() for r in caplog.records)
    for key in ("server.tcp_fast_open", "ota.release_canary", "fleet_sim", "mqtt.pipelines[0].priority"):
        assert f"key {key} is not known" in warned


def test_a_parser_one_version_back_reads_this_releases_file_with_its_new_keys() -> None:
    text = f"config_version = {CONFIG_VERSION}\n[ota]\nrelease_health_s = 90\n"
    assert parse_config(text).ota.release_health_s == 90
    older = parse_config(text.replace("release_health_s", "release_grace_s"), supported=CONFIG_VERSION - 1)
    assert older.ota == EdgedConfig().ota


def test_unknown_keys_of_this_version_are_still_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"unknown key fleet_sim"):
        parse_config(NEWER.replace(f"config_version = {CONFIG_VERSION + 1}", f"config_version = {CONFIG_VERSION}"))
    with pytest.raises(ConfigError, match=r"unknown key ota\.release_canary"):
        parse_config("[ota]\nrelease_canary = 1\n")  # no config_version: this release's format


def test_known_keys_are_checked_strictly_even_in_a_newer_file() -> None:
    with pytest.raises(ConfigError, match=r"ota\.release_health_s: expected a positive number"):
        parse_config(f"config_version = {CONFIG_VERSION + 1}\n[ota]\nrelease_health_s = 0\n")
    with pytest.raises(ConfigError, match=r"config_version: expected a config format version"):
        parse_config("config_version = 0\n")
