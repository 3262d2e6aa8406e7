"""Stopping a run cleanly: the first Ctrl-C or SIGTERM asks the loop to save and stop.

With several processes (hosts) a stop must be agreed: if one process stopped
and saved alone, the others would wait for it in the next step's collectives
and the run would hang instead of writing a checkpoint. So after every step
each process contributes its own request to a one-number all-reduce across all
devices (:class:`StopRequest`); the result of step ``s`` is read at step
``s + lag``, when that step has long finished on every device, so it costs no
wait; and as every process reads the same value at the same step, all stop at
that step and write one checkpoint together.

JAX's own preemption service (``multihost_utils.reached_preemption_sync_point``,
which orbax's ``reached_preemption`` wraps) listens to SIGTERM alone, through a
C++ handler, and cannot be told about a Ctrl-C; so ddim keeps SIGINT and SIGTERM
for itself (see :func:`ddim.parallel.initialize_distributed`) and agrees
through the devices, which every backend supports.
"""

from __future__ import annotations

import collections
import signal

# Steps between a process's request and the step at which all stop (see the module docstring).
# The loop keeps at most two steps in flight, so the vote of step s is finished by step s + 2.
AGREEMENT_LAG = 2


class StopRequest:
    """Turns the first SIGINT/SIGTERM into a request to save and stop; a second SIGINT aborts.

    Used as a context manager around the loop, which asks :meth:`agreed` after
    every step. Outside the main thread signals cannot be caught, and this
    only stops when :meth:`request` is called.
    """

    def __init__(self, mesh=None, lag: int = AGREEMENT_LAG):
        self.requested = False
        self._previous = {}
        self._vote = _vote_fn(mesh) if mesh is not None and _process_count() > 1 else None
        self._votes = collections.deque()
        self._lag = lag

    def __enter__(self):
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            self._previous = {}
        return self

    def request(self) -> None:
        """Ask for a stop (what the signal handlers do)."""
        self.requested = True

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.request()

    def agreed(self, step: int) -> bool:
        """Whether to stop after ``step``; call once per step on every process.

        One process: as soon as a stop is requested. Several: ``lag`` steps
        after any process requested one, the same step on all of them.
        """
        if self._vote is None:
            return self.requested
        self._votes.append(self._vote(self.requested))
        if len(self._votes) <= self._lag:
            return False
        return bool(self._votes.popleft())

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def _process_count() -> int:
    import jax

    return jax.process_count()


def _vote_fn(mesh):
    """``vote(flag)``: dispatch the OR of every process's ``flag`` (a replicated scalar, not waited for)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ddim import parallel

    any_flag = jax.jit(jnp.max, out_shardings=parallel.replicated(mesh))
    local_devices = len([d for d in mesh.devices.flat if d.process_index == jax.process_index()])

    def vote(flag: bool):
        # One entry per device, sharded like a batch: each process brings its own entries.
        return any_flag(parallel.global_batch(np.full((local_devices,), int(flag), np.int32), mesh))

    return vote
