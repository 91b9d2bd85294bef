"""The databases a newer release may migrate (telemetry, MQTT outbox): backed up before it starts, restored
after a rollback when it did migrate them, so the previous release finds a schema it knows.

Backups use SQLite's online backup API (a consistent copy even of a WAL database) and are taken while edged is
stopped, so no row written by the previous release is lost. A database is "migrated" when its
``PRAGMA user_version`` changed; an unmigrated one keeps what the new release wrote while it ran.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import closing
from pathlib import Path

from edged.errors import UpdateRejected


def user_version(path: Path) -> int:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def _copy(source: Path, destination: Path) -> None:
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(destination)) as dst:
        src.backup(dst)


def _plain_file(path: Path, doing: str) -> bool:
    """Whether ``path`` is a regular file; a link is refused. The databases sit in edged's state directory, where
    the edged user could put a link to a file of root's: edged-update (root) never opens one through it."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode):
        raise UpdateRejected(f"{doing}: a link (edged-update does not follow links in edged's state "
                             "directory): replace it with the database file")
    return stat.S_ISREG(mode)


def back_up(databases: list[Path], folder: Path) -> dict[str, int]:
    """Copy each existing database into ``folder`` (root's alone); returns {path: user_version} of what was
    copied."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)  # one made by an earlier edged-update with the umask's mode
    versions: dict[str, int] = {}
    for index, path in enumerate(databases):
        if not _plain_file(path, f"backing up {path}"):
            continue
        copy = folder / f"{index}.{path.name}"
        copy.unlink(missing_ok=True)
        try:
            _copy(path, copy)
            versions[str(path)] = user_version(copy)
        except sqlite3.Error as e:
            raise UpdateRejected(f"backing up {path} before the new release starts: {e}") from e
    return versions


def restore_migrated(databases: list[Path], folder: Path, versions: dict[str, int]) -> list[str]:
    """Put back each database whose schema version changed since the backup; returns the restored paths.
    Writing through SQLite into the live file keeps its owner (edged) and mode."""
    restored = []
    for index, path in enumerate(databases):
        if str(path) not in versions or not _plain_file(path, f"restoring {path} for the previous release"):
            continue
        try:
            if user_version(path) == versions[str(path)]:
                continue
            _copy(folder / f"{index}.{path.name}", path)
        except sqlite3.Error as e:
            raise UpdateRejected(f"restoring {path} for the previous release: {e}") from e
        restored.append(str(path))
    return restored
