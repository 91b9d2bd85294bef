"""Restart-loop detection from the daemon's own record of its starts.

The unit restarts edged forever (StartLimitIntervalSec=0): a field device must never stay down waiting for a
person. The price is that a crash loop no longer shows as "failed" in systemctl, so the daemon says it itself.
Each start is appended to ``starts.json`` in the state directory together with whether the run before it
stopped cleanly (a clean stop is marked at the end of shutdown). When this start followed an unclean end
(crash, kill, watchdog abort) and ``LOOP_STARTS`` such starts fall within ``LOOP_WINDOW_S`` of device time,
the daemon is restarting in a loop: it logs a warning, puts it into sd_notify's STATUS= and into ``/v2/edged/status``.

Times are the device clock's elapsed seconds (edged.clock), so a wall-clock step after an offline boot can
neither invent a loop nor hide one. The file is small and rewritten atomically; a missing, damaged or
unwritable file counts as no history and never stops the daemon from starting.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.clock import Clock
from edged.durable import write_atomic

log = logging.getLogger(__name__)

HISTORY_FILE = "starts.json"
LOOP_STARTS = 3
LOOP_WINDOW_S = 600.0
KEEP_STARTS = 20


@dataclass(frozen=True)
class RestartLoop:
    """What the last starts say: ``unclean`` of ``starts`` within ``window_s`` followed an unclean end."""

    starts: int
    unclean: int
    window_s: float
    previous_run_s: float | None

    def message(self) -> str:
        last = ("the previous run ended without a clean stop (crash, kill or watchdog)"
                + (f" {self.previous_run_s:.0f} s after it started" if self.previous_run_s is not None else ""))
        return (f"restarting in a loop: {self.starts} starts in {self.window_s / 60:.0f} min, {self.unclean} "
                f"after an unclean end; {last}; see the journal of the runs before this one")

    def as_dict(self) -> dict[str, Any]:
        return {"starts": self.starts, "unclean": self.unclean, "window_s": self.window_s,
                "previous_run_s": self.previous_run_s, "message": self.message()}


class StartHistory:
    def __init__(self, state_dir: Path, clock: Clock, *, window_s: float = LOOP_WINDOW_S,
                 loop_starts: int = LOOP_STARTS) -> None:
        self.path = state_dir / HISTORY_FILE
        self._clock = clock
        self._window_s = window_s
        self._loop_starts = loop_starts
        self.loop: RestartLoop | None = None

    def record_start(self) -> RestartLoop | None:
        """Append this start; the loop it reveals, if any (also kept in ``self.loop``)."""
        document = self._read()
        now = self._clock.elapsed()
        starts = [s for s in document["starts"] if now - s["at"] <= self._window_s][-KEEP_STARTS:]
        previous = document["starts"][-1]["at"] if document["starts"] else None
        starts.append({"at": now, "after_clean_stop": bool(document["clean_stop"])})
        self._write({"starts": starts, "clean_stop": False})
        unclean = sum(1 for s in starts if not s["after_clean_stop"])
        if unclean >= self._loop_starts and not document["clean_stop"]:  # a clean stop ended any loop
            last_run = None if previous is None or document["clean_stop"] else max(0.0, now - previous)
            self.loop = RestartLoop(len(starts), unclean, self._window_s, last_run)
            log.warning("%s", self.loop.message())
        else:
            self.loop = None
        return self.loop

    def record_clean_stop(self) -> None:
        document = self._read()
        self._write({"starts": document["starts"], "clean_stop": True})

    def _read(self) -> dict[str, Any]:
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
            starts = [{"at": float(s["at"]), "after_clean_stop": bool(s["after_clean_stop"])}
                      for s in document["starts"]]
            return {"starts": starts, "clean_stop": bool(document["clean_stop"])}
        except FileNotFoundError:
            return {"starts": [], "clean_stop": True}
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.warning("ignoring the unreadable start history %s: %s", self.path, e)
            return {"starts": [], "clean_stop": True}

    def _write(self, document: dict[str, Any]) -> None:
        try:
            write_atomic(self.path, json.dumps(document).encode())
        except OSError as e:
            # A full disk must not keep the daemon from starting; the loop check is lost for this start only.
            log.warning("could not record the start history in %s: %s", self.path, e)
