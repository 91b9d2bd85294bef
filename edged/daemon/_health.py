"""The health board on the daemon's surfaces: the ``health`` section of ``/v2/edged/status`` and ``/metrics``.

Readiness (``/v2/health/ready``) deliberately reads none of this: it is about inference, and an MQTT or disk
problem must not make HTTP clients think the models are down.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from edged.exposition import MetricFamily, render
from edged.supervision import Component, HealthBoard, backoff_s

log = logging.getLogger(__name__)


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


def stalled_runs(runs: list[tuple[str, str, float]], limit_s: float) -> list[tuple[str, str, float]]:
    """The (model, version, seconds) of ``runs`` whose longest execution has gone past ``limit_s``."""
    return [run for run in runs if run[2] > limit_s]


def stall_reason(stalled: list[tuple[str, str, float]], limit_s: float) -> str:
    """The "engine" component's reason while runs are stalled: which, for how long, and what it means."""
    runs = "; ".join(f"model {model} version {version}: a run has been running for {running_s:.0f} s"
                     for model, version, running_s in stalled)
    return (f"{runs} (past [models] stall_timeout_s = {limit_s:g} s: a wedged backend; the systemd watchdog pings "
            "are withheld until it finishes)")


def render_stalls(runs: list[tuple[str, str, float]], limit_s: float) -> str:
    stalled = MetricFamily("edged_model_run_stalled", "gauge",
                           "1 while a run of this loaded model version has gone longer than [models] "
                           "stall_timeout_s (a wedged backend).")
    for model, version, running_s in runs:
        stalled.add(int(running_s > limit_s), {"model": model, "version": version})
    return render([stalled])


async def supervised_task(component: Component, work: Callable[[], Awaitable[None]], *, backoff_min_s: float = 1.0,
                          backoff_max_s: float = 60.0, rng: random.Random | None = None) -> None:
    """The event loop's counterpart of `SupervisedThread`: ``work`` runs again after an unexpected exception,
    with backoff; cancelling the task (shutdown) ends it, since CancelledError is not an Exception."""
    rng = rng or random.Random()
    attempt = 0
    while True:
        try:
            await work()
            return
        except Exception as e:
            attempt = 0 if component.health.state == "ok" else attempt
            delay = backoff_s(attempt, backoff_min_s, backoff_max_s, rng)
            attempt += 1
            log.exception("background task %s failed; restarting in %.1f s", component.name, delay)
            component.error(e)
        await asyncio.sleep(delay)
        component.restarting()
