"""What edged subscribed to in its broker session, remembered in the state directory across runs.

edged's session is persistent (clean_start off, session expiry), so the broker keeps every subscription an
earlier run made until one is undone. A filter taken out of the config (a pipeline removed or its input changed)
would otherwise keep its messages coming for the session's life: dropped as unrouted, or, when it overlaps a
filter still configured (``$share/g/x/+`` then ``x/+``), delivered twice and answered twice under two
``edged_message_id``\\ s. ``stale`` lists the filters to unsubscribe; ``save`` records the current ones once the
broker has none of the others (its UNSUBACK, or a session that was not present). The file is JSON,
``{"client_id": ..., "filters": [...]}``, replaced atomically; one that is missing or unreadable means nothing
to undo (a warning when it cannot be read).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import orjson

log = logging.getLogger(__name__)
SUBSCRIPTIONS_FILE = "mqtt-subscriptions.json"


class Subscriptions:
    def __init__(self, path: Path, client_id: str, filters: list[str]) -> None:
        self._path = path
        self._client_id = client_id
        self._filters = filters
        earlier = self._read()
        self.stale = [f for f in earlier if f not in filters]
        if not self.stale and set(earlier) != set(filters):
            self.save()  # only new filters: the next run must know them, whether or not this one connects

    def _read(self) -> list[str]:
        try:
            doc = orjson.loads(self._path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, orjson.JSONDecodeError) as e:
            log.warning("mqtt: cannot read %s (%s); filters an earlier run subscribed to and the config no longer "
                        "has stay subscribed in the broker session", self._path, e)
            return []
        if not isinstance(doc, dict) or doc.get("client_id") != self._client_id:
            return []  # another client id: its session is not this one's
        filters = doc.get("filters")
        return [f for f in filters if isinstance(f, str)] if isinstance(filters, list) else []

    def save(self) -> None:
        """Record the current filters (atomically: a crash leaves the old file or the new one)."""
        self.stale = []
        temporary = self._path.with_name(self._path.name + ".tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_bytes(orjson.dumps({"client_id": self._client_id, "filters": self._filters}))
            os.replace(temporary, self._path)
        except OSError as e:
            with contextlib.suppress(OSError):
                temporary.unlink()
            log.warning("mqtt: cannot write %s (%s); a filter later taken out of the config stays subscribed in "
                        "the broker session", self._path, e)
