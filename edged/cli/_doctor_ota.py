"""The ``[ota]`` checks of ``edged doctor``: the trusted root is there, the repository answers, the clock can
judge expiry. Only reads (no TUF state is changed: the daemon's metadata cache is left alone)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from edged.cli._doctor_checks import Check
from edged.config import OtaConfig

EARLIEST_SANE_WALL = 1_735_689_600.0  # 2025-01-01: a clock before this cannot judge metadata expiry
PROBE_TIMEOUT_S = 5.0


def check_ota(config: OtaConfig, now: float | None = None) -> list[Check]:
    if not config.enabled:
        return [Check("ota", "info", "model updates are off ([ota] enabled = false)")]
    wall = time.time() if now is None else now
    results = [_root(Path(config.root_file))]
    if wall < EARLIEST_SANE_WALL:
        results.append(Check("ota clock", "fail", f"the clock reads {_date(wall)}: every signed metadata file "
                             "looks expired or not yet valid, so updates are refused (reason \"clock\")",
                             "set the time (timedatectl set-ntp true, or an RTC battery)"))
    timestamp, problem = _timestamp(str(config.repository_url or ""))
    if timestamp is None:
        results.append(Check("ota repository", "fail", problem, "check [ota] repository_url and the network; "
                             "the repository must serve metadata/timestamp.json"))
        return results
    expires = _expiry(timestamp)
    detail = f"{config.repository_url}: timestamp version {timestamp.get('version')}, expires {expires or '?'}"
    results.append(Check("ota repository", "ok", detail))
    if expires is not None and wall >= EARLIEST_SANE_WALL and expires.timestamp() < wall:
        results.append(Check("ota clock", "warn", f"the repository's timestamp expired {expires} (now "
                             f"{_date(wall)}): devices refuse it as a freeze",
                             "run `edged fleet refresh REPO` on the operator's machine, or check this clock"))
    elif wall >= EARLIEST_SANE_WALL:
        results.append(Check("ota clock", "ok", f"{_date(wall)}: metadata expiry can be judged"))
    return results


def _root(path: Path) -> Check:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        signed = doc["signed"]
        if signed.get("_type") != "root":
            raise ValueError(f"_type is {signed.get('_type')!r}, expected 'root'")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return Check("ota root", "fail", f"trusted root {path}: {e}",
                     "install the fleet's root.json (printed by `edged fleet init`) there, or set [ota] root_file")
    return Check("ota root", "ok", f"{path}: root version {signed.get('version')}, "
                 f"{len(signed.get('keys', {}))} keys")


def _timestamp(url: str) -> tuple[dict[str, Any] | None, str]:
    address = url.rstrip("/") + "/metadata/timestamp.json"
    try:
        with urllib.request.urlopen(address, timeout=PROBE_TIMEOUT_S) as response:
            doc = json.loads(response.read(1 << 20))
        return dict(doc["signed"]), ""
    except urllib.error.HTTPError as e:
        return None, f"{address}: HTTP {e.code}"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"{address}: {e}"


def _expiry(signed: dict[str, Any]) -> datetime | None:
    try:
        return datetime.fromisoformat(str(signed["expires"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None


def _date(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall))
