"""The OTA lines of /metrics, rendered from the agent's status (the same numbers `edged ota status` shows)."""

from __future__ import annotations

from typing import Any

from edged.ota._state import ALLOWED


def ota_metrics(status: dict[str, Any]) -> str:
    lines = ["# HELP edged_ota_state 1 for the state of the current (or last) model update.",
             "# TYPE edged_ota_state gauge"]
    lines += [f'edged_ota_state{{state="{state}"}} {int(status.get("state") == state)}' for state in ALLOWED]
    download = status.get("download", {})
    lines += ["# HELP edged_ota_fetched_bytes_total Bytes of update targets fetched over the network.",
              "# TYPE edged_ota_fetched_bytes_total counter",
              f"edged_ota_fetched_bytes_total {int(download.get('fetched_bytes', 0))}",
              "# HELP edged_ota_bad_targets Targets refused or rolled back, never retried.",
              "# TYPE edged_ota_bad_targets gauge", f"edged_ota_bad_targets {int(status.get('bad_targets', 0))}",
              "# HELP edged_ota_check_refused 1 when the last check's metadata was refused.",
              "# TYPE edged_ota_check_refused gauge",
              f"edged_ota_check_refused {int(status.get('last_check', {}).get('outcome') == 'refused')}"]
    return "\n".join(lines) + "\n"
