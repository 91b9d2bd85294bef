"""The update state machine of one target, and its durable record.

States: idle → downloading → verified → staged → activating → watching → active, with rolled_back and refused
as the other ends. Transitions are guarded (a wrong one is a programmer error, `RuntimeError`) and do no I/O;
`UpdateStore` persists the whole record atomically after every transition, so a kill -9 or a power loss at any
step finds the last state on disk and `resume_action` says what to do with it. The store also keeps the
history, the hashes of targets found bad (never retried unless the operator clears them) and the models OTA
installed (loaded again after a restart in every model control mode).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from edged.ota._durable import write_atomic

State = Literal["idle", "downloading", "verified", "staged", "activating", "watching", "active", "rolled_back",
                "refused"]
FINAL: frozenset[State] = frozenset({"active", "rolled_back", "refused"})
ALLOWED: dict[State, frozenset[State]] = {
    "idle": frozenset({"downloading", "refused"}),
    "downloading": frozenset({"downloading", "verified", "refused"}),
    "verified": frozenset({"staged", "refused"}),
    "staged": frozenset({"activating", "refused"}),
    "activating": frozenset({"watching", "rolled_back", "refused"}),
    "watching": frozenset({"active", "rolled_back"}),
    "active": frozenset({"rolled_back"}),
    "rolled_back": frozenset(),
    "refused": frozenset(),
}
HISTORY_LIMIT = 50


@dataclass
class TargetUpdate:
    target: str
    sha256: str
    model: str
    version: int
    previous_version: int | None = None
    installed_before: int | None = None  # the model's OTA-installed version before this one was confirmed
    state: State = "idle"
    reason: str = ""
    changed_at: float = field(default_factory=time.time)
    history: list[tuple[str, float, str]] = field(default_factory=list)  # (state, wall time, reason)

    def move(self, state: State, reason: str = "") -> None:
        if state not in ALLOWED[self.state]:
            raise RuntimeError(f"update {self.target}: {self.state} → {state} is not a transition")
        self.state, self.reason, self.changed_at = state, reason, time.time()
        self.history.append((state, self.changed_at, reason))

    @property
    def final(self) -> bool:
        return self.state in FINAL


def resume_action(update: TargetUpdate) -> Literal["none", "download", "stage", "roll_back", "watch"]:
    """What a restart does with an update it finds in ``update.state``."""
    if update.state in ("idle", "downloading", "verified"):
        return "download"  # the download resumes from its partial file; verification is repeated anyway
    if update.state == "staged":
        return "stage"  # staging is redone from the verified bundle: nothing of it was served yet
    if update.state in ("activating", "watching"):
        return "roll_back"  # the health of the new version was not confirmed: go back to the previous one
    return "none"


class UpdateStore:
    def __init__(self, path: Path, on_save: Callable[[], None] | None = None) -> None:
        self.path = path
        self.on_save = on_save  # told after every durable change (the agent republishes its status)
        self.current: TargetUpdate | None = None
        self.history: list[dict[str, Any]] = []
        self.bad: dict[str, str] = {}  # sha256 → why
        self.installed: dict[str, int] = {}  # model → version installed by OTA
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        doc = json.loads(self.path.read_text(encoding="utf-8"))
        current = doc.get("current")
        if current:
            current["history"] = [tuple(h) for h in current.get("history", [])]
            self.current = TargetUpdate(**current)
        self.history = list(doc.get("history", []))
        self.bad = dict(doc.get("bad", {}))
        self.installed = {str(k): int(v) for k, v in doc.get("installed", {}).items()}

    def save(self) -> None:
        doc = {"current": asdict(self.current) if self.current else None, "history": self.history[-HISTORY_LIMIT:],
               "bad": self.bad, "installed": self.installed}
        write_atomic(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
        if self.on_save is not None:
            self.on_save()

    def begin(self, update: TargetUpdate) -> None:
        if self.current is not None and not self.current.final:
            raise RuntimeError(f"update {self.current.target} is still {self.current.state}")
        self.current = update
        self.save()

    def move(self, state: State, reason: str = "") -> TargetUpdate:
        if self.current is None:
            raise RuntimeError("no update in progress")
        self.current.move(state, reason)
        if self.current.final:
            self.history.append(asdict(self.current))
        self.save()
        return self.current
