"""The device slot: requests run one at a time on the device, and the first of each shape says it compiles."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Hashable

Status = Callable[[str], None]


class DeviceSlot:
    """One request at a time on the device (a lock, besides the web queue), remembering the shapes compiled."""

    def __init__(self):
        self._lock = threading.Lock()
        self._compiled: set[Hashable] = set()

    def run(self, shape: Hashable, description: str, status: Status | None, work: Callable[[], Any]):
        """Run ``work`` alone on the device; returns ``(its result, seconds, whether it compiled)``.

        ``shape`` names the compiled programs ``work`` needs: the first request with a
        new one is announced as compiling (the persistent compilation cache, when on,
        makes that quick after the first run of the server).
        """
        with self._lock:
            compiles = shape not in self._compiled
            if status is not None:
                status(f"compiling for {description} (first request of this shape; later ones reuse it)..."
                       if compiles else f"running {description}...")
            started = time.perf_counter()
            result = work()
            seconds = time.perf_counter() - started
            self._compiled.add(shape)
        return result, seconds, compiles
