"""Stopping a run cleanly: the first Ctrl-C or SIGTERM asks the loop to save and stop."""

from __future__ import annotations

import signal


class StopRequest:
    """Turns the first SIGINT/SIGTERM into a request to save and stop; a second SIGINT aborts.

    Used as a context manager around the loop, which checks :attr:`requested`
    after every step. Outside the main thread signals cannot be caught, and
    this does nothing.
    """

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            self._previous = {}
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False
