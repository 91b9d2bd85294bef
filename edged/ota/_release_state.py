"""The state machine of one daemon release update on the device, and its durable record.

States: idle → downloading → handed_off (verified, dropped for the privileged step) → installing (edged-update
took it) → active, with rolled_back and refused as the other ends. The daemon moves it as far as handed_off;
the rest is what ``edged-update`` reports in its outcome file, read back by whichever release serves next.
Transitions are guarded (a wrong one is a programmer error, `RuntimeError`) and do no I/O; `ReleaseStore`
persists the record atomically after every move, so a kill -9 finds it where it was: a download resumes, a
hand-off waits for its outcome.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from edged.ota._durable import write_atomic

ReleaseState = Literal["idle", "downloading", "handed_off", "installing", "active", "rolled_back", "refused"]
RELEASE_FINAL: frozenset[ReleaseState] = frozenset({"active", "rolled_back", "refused"})
RELEASE_ALLOWED: dict[ReleaseState, frozenset[ReleaseState]] = {
    "idle": frozenset({"downloading", "refused"}),
    "downloading": frozenset({"downloading", "handed_off", "refused"}),
    "handed_off": frozenset({"installing", "active", "rolled_back", "refused"}),
    "installing": frozenset({"active", "rolled_back", "refused"}),
    "active": frozenset(),
    "rolled_back": frozenset(),
    "refused": frozenset(),
}
HISTORY_LIMIT = 20


@dataclass
class ReleaseUpdate:
    target: str
    sha256: str
    version: str
    previous_version: str
    state: ReleaseState = "idle"
    reason: str = ""
    changed_at: float = field(default_factory=time.time)

    def move(self, state: ReleaseState, reason: str = "") -> None:
        if state not in RELEASE_ALLOWED[self.state]:
            raise RuntimeError(f"release {self.target}: {self.state} → {state} is not a transition")
        self.state, self.reason, self.changed_at = state, reason, time.time()

    @property
    def final(self) -> bool:
        return self.state in RELEASE_FINAL


class ReleaseStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.current: ReleaseUpdate | None = None
        self.history: list[dict[str, Any]] = []
        self.bad: dict[str, str] = {}  # sha256 → why: a release that failed is never retried
        if path.exists():
            doc = json.loads(path.read_text(encoding="utf-8"))
            self.current = ReleaseUpdate(**doc["current"]) if doc.get("current") else None
            self.history = list(doc.get("history", []))
            self.bad = dict(doc.get("bad", {}))

    def save(self) -> None:
        doc = {"current": asdict(self.current) if self.current else None, "history": self.history[-HISTORY_LIMIT:],
               "bad": self.bad}
        write_atomic(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())

    def begin(self, update: ReleaseUpdate) -> None:
        if self.current is not None and not self.current.final:
            raise RuntimeError(f"release {self.current.target} is still {self.current.state}")
        self.current = update
        self.save()

    def move(self, state: ReleaseState, reason: str = "") -> ReleaseUpdate:
        if self.current is None:
            raise RuntimeError("no release update in progress")
        self.current.move(state, reason)
        if state in ("rolled_back", "refused"):
            self.bad[self.current.sha256] = reason
        if self.current.final:
            self.history.append(asdict(self.current))
        self.save()
        return self.current
