"""The device slot: requests run one at a time on the device, and what a request's time includes besides running."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Hashable

from ddim.compilation import counting_compilations

Status = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a request built before it ran: the first request of a shape needs its programs."""

    first_of_shape: bool  # no earlier request of this server had its shape
    compiled: int = 0  # programs XLA compiled during the request
    from_cache: int = 0  # programs read from the persistent compilation cache during the request

    def note(self) -> str:
        """What the request's time includes, for its summary ("" when it only ran)."""
        if self.compiled:
            return " (including compiling for this shape: the first request of a shape compiles, later ones reuse it)"
        if self.from_cache:
            return (" (including reading this shape's programs from the compilation cache: the first request of a"
                    " shape does, later ones reuse them)")
        return ""


def first_request_status(description: str) -> str:
    """The progress line of a shape's first request: it compiles, or with the persistent compilation cache on
    (``ddim.compilation``) may only read what an earlier run compiled."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        return (f"preparing {description}: compiling, or reading the compilation cache (first request of this "
                "shape; later ones reuse it)...")
    return f"compiling for {description} (first request of this shape; later ones reuse it)..."


class DeviceSlot:
    """One request at a time on the device (a lock, besides the web queue), remembering the shapes built."""

    def __init__(self):
        self._lock = threading.Lock()
        self._built: set[Hashable] = set()

    def run(self, shape: Hashable, description: str, status: Status | None, work: Callable[[], Any]):
        """Run ``work`` alone on the device; returns ``(its result, seconds, its Setup)``.

        ``shape`` names the compiled programs ``work`` needs: the first request with a new
        one is announced as compiling, and its :class:`Setup` counts what was compiled and
        what the persistent compilation cache (when on) supplied instead.
        """
        with self._lock:
            first = shape not in self._built
            if status is not None:
                status(first_request_status(description) if first else f"running {description}...")
            started = time.perf_counter()
            with counting_compilations() as count:
                result = work()
            seconds = time.perf_counter() - started
            self._built.add(shape)
        return result, seconds, Setup(first, count.compiled, count.from_cache)
