"""What the registry knows of one model: its served versions, failed versions and how it was last loaded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edged.engine.lifecycle import ModelState
from edged.engine.version import ModelVersion
from edged.repository import Fingerprint

READY = ModelState.READY


class ModelRecord:
    """A model known to the service: its served versions and the outcome of the last load."""

    def __init__(self, name: str) -> None:
        self.name = name
        # Served versions by number. Replaced (or `drop`ped from) as a whole, never changed in place, so that
        # the cached default below can tell whether it was chosen from the current dict.
        self.versions: dict[int, ModelVersion] = {}
        # The default version (highest ready) with the dict it was chosen from: every request without a version
        # asks for it, so it is chosen once per change of the dict, not per request.
        self.chosen: tuple[dict[int, ModelVersion], ModelVersion | None] = ({}, None)
        self.failed: dict[int, ModelVersion] = {}  # versions whose last load failed, with the reason
        # Versions being loaded now (state LOADING), so the index shows them as Triton's does; replaced as a whole,
        # like ``versions``, because the index reads it without the registry lock.
        self.loading: dict[int, ModelVersion] = {}
        self.error = ""  # a failure before any version could be tried (bad config, missing runtime)
        self.fingerprint: Fingerprint = {}  # of the files the served versions were loaded from
        self.loaded_explicitly = False

    def drop(self, number: int) -> None:
        self.versions = {n: v for n, v in self.versions.items() if n != number}

    def default_version(self) -> ModelVersion | None:
        """The highest ready version, or None."""
        chosen_from, version = self.chosen
        if chosen_from is self.versions and version is not None and version.lifecycle.state is READY:
            return version
        versions = self.versions
        ready = [v for _, v in sorted(versions.items()) if v.lifecycle.state is READY]
        version = ready[-1] if ready else None
        self.chosen = (versions, version)
        return version

    def ready_versions(self) -> list[ModelVersion]:
        return [v for _, v in sorted(self.versions.items()) if v.state is ModelState.READY]

    def all_versions(self) -> list[ModelVersion]:
        return [v for _, v in sorted(self.versions.items())]


def index_entries(names: list[str], records: Mapping[str, ModelRecord],
                  unloaded: Mapping[str, tuple[str, tuple[int, ...]]], ready_only: bool) -> list[dict[str, Any]]:
    """The repository index (Triton's form): one entry per version, or one per model without versions; an
    unloaded model's entries keep the versions it had, as Triton's do. ``unloaded``: name → (why, versions)."""
    entries: list[dict[str, Any]] = []
    for name in names:
        record = records.get(name)
        # a served version hides a retry of its number, which hides the failure before it
        versions = sorted({**(record.failed if record else {}), **(record.loading if record else {}),
                           **(record.versions if record else {})}.items())
        if not versions:
            if ready_only:
                continue
            why, numbers = unloaded.get(name, ("", ()))
            if record is None and numbers:
                entries += [{"name": name, "version": str(n), "state": "UNAVAILABLE", "reason": why} for n in numbers]
                continue
            known = record is not None or name in unloaded
            entries.append({"name": name, "version": "", "state": "UNAVAILABLE" if known else "",
                            "reason": record.error if record else why})
            continue
        for number, version in versions:
            if ready_only and version.state is not READY:
                continue
            entries.append({"name": name, "version": str(number), "state": version.state.value,
                            "reason": version.lifecycle.reason})
    return entries
