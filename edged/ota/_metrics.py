"""The OTA lines of /metrics, rendered from the agent's status (the same numbers `edged ota status` shows)."""

from __future__ import annotations

from typing import Any

from edged.exposition import MetricFamily, render
from edged.ota._release_state import RELEASE_ALLOWED
from edged.ota._state import ALLOWED


def ota_metrics(status: dict[str, Any]) -> str:
    states = MetricFamily("edged_ota_state", "gauge", "1 for the state of the current (or last) model update.")
    for state in ALLOWED:
        states.add(int(status.get("state") == state), {"state": state})
    release = MetricFamily("edged_ota_release_state", "gauge", "1 for the state of the current (or last) daemon "
                           "release update.")
    for release_state in RELEASE_ALLOWED:
        release.add(int(status.get("release", {}).get("state") == release_state), {"state": release_state})
    download = status.get("download", {})
    refused = status.get("last_check", {}).get("outcome") == "refused"
    return render([
        states, release,
        MetricFamily("edged_ota_fetched_bytes_total", "counter",
                     "Bytes of update targets fetched over the network.").add(int(download.get("fetched_bytes", 0))),
        MetricFamily("edged_ota_bad_targets", "gauge", "Targets refused or rolled back, never retried.")
        .add(int(status.get("bad_targets", 0))),
        MetricFamily("edged_ota_check_refused", "gauge", "1 when the last check's metadata was refused.")
        .add(int(refused)),
    ])
