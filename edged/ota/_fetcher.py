"""`ResumableFetcher`: ngclient's network edge, continuing interrupted target downloads with HTTP ``Range``.

Guarantees: a target download that is cut (network, kill -9, power) keeps what arrived in a partial file under
the state directory, keyed by the URL (consistent snapshots put the hash in the target's URL, so a key never
names two contents); the next attempt, in this process or after a restart, asks only for the rest. A server
that ignores ``Range`` (200 instead of 206) gets the partial discarded and the whole file streamed. What this
class yields is still checked by ngclient (length while streaming, then length and hashes), so a wrong partial
costs one re-download, never a wrong target. Metadata is never resumed (small, and not content-addressed).

Slow retrieval (a server or a path that trickles bytes to hold a device in a download forever): every
``rate_window_s`` the bytes of the window must reach ``min_bytes_per_s`` on average, and no read may wait longer
than ``timeout_s``; otherwise the download stops with `SlowRetrieval` (what arrived stays resumable). Reads take
what the socket has (``read1``), so a trickle is measured as it comes, not after a whole chunk.
"""

from __future__ import annotations

import hashlib
import http.client
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import _GeneratorContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO

from tuf.api import exceptions
from tuf.ngclient.fetcher import FetcherInterface

CHUNK = 64 * 1024


@dataclass
class Progress:
    url: str = ""
    received_bytes: int = 0  # of the file, partial included
    total_bytes: int | None = None
    resumed_from: int = 0
    fetched_bytes: int = 0  # over the network in this process, all downloads together

    def as_json(self) -> dict[str, object]:
        return {"url": self.url, "received_bytes": self.received_bytes, "total_bytes": self.total_bytes,
                "resumed_from": self.resumed_from, "fetched_bytes": self.fetched_bytes}


class SlowRetrieval(exceptions.DownloadError):
    """The server sent less than the minimum rate over a window, or nothing for longer than the read timeout."""


class Stopping(exceptions.DownloadError):
    """The daemon is stopping: the download ends at once, and is resumed (not refused) at the next start."""


class ResumableFetcher(FetcherInterface):
    def __init__(self, partial_dir: Path, targets_prefix: str, *, max_bytes_per_s: int = 0, timeout_s: float = 30,
                 min_bytes_per_s: int = 0, rate_window_s: float = 60.0, sleep: Callable[[float], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.partial_dir = partial_dir
        self.targets_prefix = targets_prefix
        self.max_bytes_per_s = max_bytes_per_s
        self.min_bytes_per_s = min_bytes_per_s
        self.rate_window_s = rate_window_s
        self.timeout_s = timeout_s
        self.progress = Progress()
        # set when the daemon stops: a download ends at its next chunk (what came stays resumable), a throttle's
        # pause at once, so the worker thread the interpreter waits for at exit is free within the stop budget
        self.stopping = threading.Event()
        self._sleep: Callable[[float], object] = sleep or self.stopping.wait
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._max_length: int | None = None

    def download_file(self, url: str, max_length: int) -> _GeneratorContextManager[IO[Any], None, None]:
        """ngclient's download with the length it allows remembered: a target's signed length is the total its
        progress reports, not whatever Content-Length a server claims."""
        self._max_length = max_length
        return super().download_file(url, max_length)

    def _fetch(self, url: str) -> Iterator[bytes]:
        self._check_stopping(url)
        if not url.startswith(self.targets_prefix):
            return self._stream(self._open(url, 0), None, 0)
        partial = self.partial_dir / hashlib.sha256(url.encode()).hexdigest()
        have = partial.stat().st_size if partial.exists() else 0
        response = self._open(url, have)
        if response.status != 206:  # the server ignored Range, or there was nothing to resume
            have = 0
        return self._resumed(url, response, partial, have)

    def _open(self, url: str, start: int) -> http.client.HTTPResponse:
        request = urllib.request.Request(url, headers={"Range": f"bytes={start}-"} if start else {})
        try:
            response: http.client.HTTPResponse = urllib.request.urlopen(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as e:
            if e.code == 416 and start:  # the partial is as long as (or longer than) the file: start over
                e.close()
                return self._open(url, 0)
            raise exceptions.DownloadHTTPError(f"GET {url}: HTTP {e.code}", e.code) from e
        except (OSError, http.client.HTTPException) as e:
            raise exceptions.DownloadError(f"GET {url}: {e}") from e
        return response

    def _resumed(self, url: str, response: http.client.HTTPResponse, partial: Path, have: int) -> Iterator[bytes]:
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        length = response.headers.get("Content-Length")
        claimed = have + int(length) if length and length.isdigit() else None
        allowed = self._max_length
        total = allowed if claimed is None or (allowed is not None and claimed > allowed) else claimed
        with self._lock:
            self.progress = Progress(url, have, total, have, self.progress.fetched_bytes)
        with open(partial, "r+b" if have else "wb") as out:
            out.truncate(have)
            out.seek(0)
            while have and (chunk := out.read(CHUNK)):
                yield chunk
            out.seek(have)
            for chunk in self._stream(response, out, have):
                yield chunk
        partial.unlink(missing_ok=True)  # complete: ngclient verifies it; a bad one must not be resumed

    def _stream(self, response: http.client.HTTPResponse, out: BinaryIO | None, start: int) -> Iterator[bytes]:
        began = self._monotonic()
        sent = 0
        window = [began, 0]  # (start, bytes) of the current rate window
        with response:
            while True:
                try:
                    chunk = response.read1(CHUNK)
                except TimeoutError as e:
                    raise SlowRetrieval(f"reading {response.url}: no data for {self.timeout_s:g} s") from e
                except (OSError, http.client.HTTPException) as e:
                    raise exceptions.DownloadError(f"reading {response.url}: {e}") from e
                if not chunk:
                    # http.client's read1 ends quietly when the connection closes early: a body cut short of
                    # its Content-Length is the network's fault (what came stays resumable), not a wrong target
                    if response.length:
                        raise exceptions.DownloadError(f"reading {response.url}: the connection closed after "
                                                       f"{start + sent} bytes, {response.length} short of the "
                                                       "Content-Length")
                    return
                if out is not None:
                    # flushed, not fsynced: a kill -9 keeps the page cache; after a power loss a torn
                    # partial fails ngclient's hash check and costs one whole download, never a wrong target
                    out.write(chunk)
                    out.flush()
                sent += len(chunk)
                with self._lock:
                    self.progress.fetched_bytes += len(chunk)
                    if out is not None:  # a target's; metadata fetched later must not overwrite its progress
                        self.progress.received_bytes = start + sent
                yield chunk
                self._throttle(began, sent)
                self._check_stopping(response.url)
                self._check_rate(response.url, window, len(chunk))

    def _check_stopping(self, url: str | None) -> None:
        if self.stopping.is_set():
            raise Stopping(f"GET {url}: the daemon is stopping; the download resumes at its next start")

    def _check_rate(self, url: str | None, window: list[float], received: int) -> None:
        window[1] += received
        elapsed = self._monotonic() - window[0]
        if self.min_bytes_per_s <= 0 or elapsed < self.rate_window_s:
            return
        if window[1] / elapsed < self.min_bytes_per_s:
            raise SlowRetrieval(f"reading {url}: {int(window[1])} bytes in the last {elapsed:.1f} s, below "
                                f"[ota] min_bytes_per_s {self.min_bytes_per_s} (over rate_window_s "
                                f"{self.rate_window_s:g})")
        window[0], window[1] = self._monotonic(), 0

    def _throttle(self, began: float, sent: int) -> None:
        if self.max_bytes_per_s <= 0:
            return
        ahead = sent / self.max_bytes_per_s - (self._monotonic() - began)
        if ahead > 0:
            self._sleep(ahead)
