"""The health board on the daemon's surfaces: the ``health`` section of ``/v2/edged/status`` and ``/metrics``.

Readiness (``/v2/health/ready``) deliberately reads none of this: it is about inference, and an MQTT or disk
problem must not make HTTP clients think the models are down.
"""

from __future__ import annotations

from typing import Any

from edged.exposition import MetricFamily, render
from edged.supervision import HealthBoard


def health_status(board: HealthBoard) -> dict[str, Any]:
    state, reason = board.overall()
    return {"state": state, "reason": reason,
            "components": {h.name: h.to_json() for h in board.snapshot()}}


def render_health(board: HealthBoard) -> str:
    components = board.snapshot()
    restarts = MetricFamily("edged_thread_restarts_total", "counter",
                            "Restarts of a supervised background thread after an unexpected exception.")
    errors = MetricFamily("edged_thread_errors_total", "counter",
                          "Unexpected exceptions in a supervised background part (each logged with a traceback).")
    degraded = MetricFamily("edged_component_degraded", "gauge",
                            "1 while a supervised part is degraded or restarting (see edged status for why).")
    for h in components:
        restarts.add(h.restarts, {"thread": h.name})
        errors.add(h.errors, {"thread": h.name})
        degraded.add(int(h.state != "ok"), {"component": h.name})
    return render([restarts, errors, degraded])
