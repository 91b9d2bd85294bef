"""Supervised background threads and the health board every surface reads.

Guarantees: a background thread never dies silently. An unexpected exception in its work is logged with its
traceback, counted on the board, marks the component "degraded" with the exception as the reason, and the work
runs again after an exponential backoff with full jitter (capped); the component stays degraded until its work
reports `Component.ok()` again. A clean return of the work, or `SupervisedThread.stop()`, ends the thread; a
stopped thread is never restarted. Errors a part expects and handles (an `OutboxError`, a failing sensor) stay
handled there; such a part may report them with `Component.degraded()`.

The board holds no I/O and no clock of its own beyond the wall time stamped on the last error for humans;
listeners (the MQTT status message) are called outside its lock, only when a component changes state.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

State = Literal["ok", "degraded", "restarting"]


@dataclass(frozen=True)
class ComponentHealth:
    name: str
    state: State
    reason: str
    restarts: int
    errors: int
    last_error: str
    last_error_at: float | None

    def to_json(self) -> dict[str, object]:
        return {"state": self.state, "reason": self.reason, "restarts": self.restarts, "errors": self.errors,
                "last_error": self.last_error, "last_error_at": self.last_error_at}


class Component:
    """One supervised part's entry on the board; its methods are safe from any thread."""

    def __init__(self, board: HealthBoard, name: str) -> None:
        self._board = board
        self.name = name
        self._health = ComponentHealth(name, "ok", "", 0, 0, "", None)

    @property
    def health(self) -> ComponentHealth:
        return self._health

    def ok(self) -> None:
        if self._health.state != "ok":  # the common case takes no lock: called after every unit of work
            self._set(state="ok", reason="")

    def degraded(self, reason: str) -> None:
        if self._health.state != "degraded" or self._health.reason != reason:
            self._set(state="degraded", reason=reason)

    def error(self, error: BaseException) -> None:
        """Record an unexpected exception: counted, and degraded with it as the reason."""
        text = f"{type(error).__name__}: {error}"[:500]
        self._set(state="degraded", reason=text, errors=1, last_error=text, last_error_at=self._board.wall())

    def restarting(self) -> None:
        self._set(state="restarting", restarts=1)

    def _set(self, *, state: State, reason: str | None = None, errors: int = 0, restarts: int = 0,
             last_error: str | None = None, last_error_at: float | None = None) -> None:
        with self._board.lock:
            h = self._health
            self._health = ComponentHealth(
                h.name, state, h.reason if reason is None else reason, h.restarts + restarts, h.errors + errors,
                h.last_error if last_error is None else last_error,
                h.last_error_at if last_error_at is None else last_error_at)
            changed = (h.state, h.reason) != (self._health.state, self._health.reason)
        if changed:
            self._board.notify()


class HealthBoard:
    """Component name -> health, for ``edged status``, ``/v2/edged/status``, ``/metrics`` and MQTT status."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.lock = threading.Lock()
        self.wall = wall
        self._components: dict[str, Component] = {}
        self._listeners: list[Callable[[], None]] = []

    def component(self, name: str) -> Component:
        with self.lock:
            if name not in self._components:
                self._components[name] = Component(self, name)
            return self._components[name]

    def snapshot(self) -> list[ComponentHealth]:
        with self.lock:
            return [c.health for _, c in sorted(self._components.items())]

    def overall(self) -> tuple[Literal["ok", "degraded"], str]:
        """("ok", "") or ("degraded", the reasons of the components that are not ok)."""
        bad = [h for h in self.snapshot() if h.state != "ok"]
        if not bad:
            return "ok", ""
        return "degraded", "; ".join(f"{h.name} {h.state}: {h.reason}" for h in bad)

    def add_listener(self, listener: Callable[[], None]) -> None:
        with self.lock:
            self._listeners.append(listener)

    def notify(self) -> None:
        with self.lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener()
            except Exception:  # a listener's failure must not break the component that changed
                log.exception("health listener %r failed", listener)


def backoff_s(attempt: int, min_s: float, max_s: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter: uniform in [min_s, min(max_s, min_s * 2**attempt)]."""
    ceiling = min(max_s, min_s * (2 ** min(attempt, 30)))
    return rng.uniform(min_s, max(min_s, ceiling))


class SupervisedThread:
    """Runs ``work`` on a daemon thread and restarts it with backoff after an unexpected exception."""

    def __init__(self, name: str, work: Callable[[], None], component: Component, *,
                 backoff_min_s: float = 0.1, backoff_max_s: float = 30.0, rng: random.Random | None = None) -> None:
        if not 0 < backoff_min_s <= backoff_max_s:
            raise ValueError(f"{name}: backoff needs 0 < min <= max, found {backoff_min_s} and {backoff_max_s}")
        self.name = name
        self.component = component
        self._work = work
        self._min_s, self._max_s = backoff_min_s, backoff_max_s
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No restart from now on; the work itself must be told to return by its owner."""
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread.ident is not None:
            self._thread.join(timeout_s)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            try:
                self._work()
                return
            except Exception as e:
                # A failure after the work reported healthy again starts the backoff from the beginning.
                attempt = 0 if self.component.health.state == "ok" else attempt
                delay = backoff_s(attempt, self._min_s, self._max_s, self._rng)
                attempt += 1
                log.exception("thread %s failed; restarting in %.1f s", self.name, delay)
                self.component.error(e)
            if self._stop.wait(delay):
                return
            self.component.restarting()


class SupervisedPool:
    """``count`` supervised threads running the same ``work``: the workers of one queue, named ``name-<i>``."""

    def __init__(self, name: str, count: int, work: Callable[[], None], component: Component) -> None:
        self._threads = [SupervisedThread(f"{name}-{index}", work, component) for index in range(count)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float) -> None:
        """No restarts from now on, then wait up to ``timeout_s`` in all; the owner has told the work to return
        (closed its queue)."""
        for thread in self._threads:
            thread.stop()
        for thread in self._threads:
            thread.join(timeout_s / max(1, len(self._threads)))
