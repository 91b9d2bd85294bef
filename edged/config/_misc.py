"""The ``[ota]`` and ``[logging]`` sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


def _positive(value: float) -> str | None:
    return None if value > 0 else "expected a positive number"


def _not_negative(value: float) -> str | None:
    return None if value >= 0 else "expected zero or a positive number"


def _fraction(value: float) -> str | None:
    return None if 0 <= value <= 1 else "expected a fraction between 0 and 1"


def _ratio(value: float) -> str | None:
    return None if value >= 1 else "expected a ratio of at least 1"


def _keep(value: int) -> str | None:
    return None if value >= 2 else "expected at least 2 (the served version and the one a rollback returns to)"


@dataclass(frozen=True)
class OtaConfig:
    """Model updates from a TUF repository (edged.ota). Every key is used; see the README's Updates section."""

    enabled: bool = False
    repository_url: str | None = None  # base URL: <url>/metadata/ and <url>/targets/
    root_file: str = "/etc/edged/ota/root.json"  # the fleet's trusted root, shipped with the install
    device_id: str | None = None  # default: derived from /etc/machine-id (cloned images share a hostname)
    check_interval_s: float = field(default=3600.0, metadata={"check": _positive})
    jitter_s: float = field(default=300.0, metadata={"check": _not_negative})
    max_bytes_per_s: int = field(default=0, metadata={"check": _not_negative})  # 0: no cap
    # slow retrieval: a download averaging less than min_bytes_per_s over a rate_window_s is given up (0: never)
    min_bytes_per_s: int = field(default=1024, metadata={"check": _not_negative})
    rate_window_s: float = field(default=60.0, metadata={"check": _positive})
    watch_s: float = field(default=300.0, metadata={"check": _not_negative})
    max_error_rate: float = field(default=0.01, metadata={"check": _fraction})
    max_p99_ratio: float = field(default=2.0, metadata={"check": _ratio})
    min_requests: int = field(default=100, metadata={"check": _not_negative})
    keep_versions: int = field(default=2, metadata={"check": _keep})
    # daemon releases: the privileged step (edged-update) waits this long for READY and the self-test
    release_health_s: float = field(default=120.0, metadata={"check": _positive})
    # edged-update's root-owned work folder; the daemon reads the outcome of a release update there
    release_work_dir: str = "/var/lib/edged-update"


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "journald", "plain"] = "auto"
