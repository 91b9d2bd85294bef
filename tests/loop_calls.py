"""`LoopCalls`: a thread profile hook that counts the Python and C calls one thread makes while recording.

The hot-path tests (tests/serving, tests/grpcapi) install it with ``threading.setprofile`` before the server's
loop thread starts, set ``loop_thread`` to that thread's ident, and count what one request costs it: counts,
not times, so the bound holds on any machine.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from types import FrameType
from typing import Any


class LoopCalls:
    """Python and C calls made on the server's loop thread while ``recording`` is set."""

    def __init__(self) -> None:
        self.recording = False
        self.loop_thread: int | None = None
        self.python: collections.Counter[str] = collections.Counter()
        self.builtin: collections.Counter[str] = collections.Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.recording or threading.get_ident() != self.loop_thread:
            return
        if event == "call":
            code = frame.f_code
            self.python[f"{Path(code.co_filename).name}:{code.co_name}"] += 1
        elif event == "c_call":
            self.builtin[getattr(arg, "__qualname__", str(arg))] += 1
