"""The work directory: its layout (:mod:`ddim.workdir.layout`) and its trainer lock (:mod:`ddim.workdir.lock`)."""

from ddim.workdir.layout import LOCK_FILE, Workdir
from ddim.workdir.lock import (
    Holder,
    WorkdirError,
    WorkdirLock,
    check_free,
    live_holder,
    lock_for_training,
)

__all__ = ["LOCK_FILE", "Holder", "Workdir", "WorkdirError", "WorkdirLock", "check_free", "live_holder", "lock_for_training"]
