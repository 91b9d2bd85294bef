"""The [memory] section rejects contradictory and out-of-range settings with the key path."""

from __future__ import annotations

import pytest

from edged.config import parse_config
from edged.errors import ConfigError


def test_budget_mb_and_percent_together_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"budget_mb or memory\.budget_percent, not both"):
        parse_config("[memory]\nbudget_mb = 512\nbudget_percent = 50\n")


@pytest.mark.parametrize("line", ["tcmalloc_release_rate = 11", "load_estimate_factor = 0",
                                  "budget_percent = 0", "allocator = 'mimalloc'"])
def test_out_of_range_values_name_the_key(line: str) -> None:
    key = line.split(" ", maxsplit=1)[0]
    with pytest.raises(ConfigError, match=f"memory.{key}"):
        parse_config(f"[memory]\n{line}\n")


def test_allocator_settings_parse() -> None:
    config = parse_config("[memory]\nallocator = 'jemalloc'\njemalloc_conf = 'dirty_decay_ms:500'\n").memory
    assert config.allocator == "jemalloc" and config.jemalloc_conf == "dirty_decay_ms:500"
