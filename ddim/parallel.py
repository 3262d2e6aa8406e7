"""Data parallelism with JAX's own engine: a 1-D device mesh, sharded batches, replicated state.

The global batch is split along the mesh axis ``data``; parameters, optimiser
state, EMA weights and BatchNorm statistics are replicated. Because the train
step is one ``jax.jit`` over global arrays, XLA inserts the collectives:
gradients are averaged and BatchNorm statistics are computed over the *global*
batch, so 1 device and N devices train the same function.

Multi-host: every process runs the same program; each feeds its own slice of
the global batch (:func:`process_slice`) and :func:`global_batch` assembles
the global array with ``jax.make_array_from_process_local_data``.
"""

from __future__ import annotations

import os
import signal

import jax
import numpy as np
from ddim.errors import UserError
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


class ParallelError(UserError, ValueError):
    """The batch cannot be split over the devices (or the distributed setup is wrong)."""


def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> bool:
    """Start ``jax.distributed`` when asked to; returns whether it was started.

    With a coordinator address the three values come from the arguments;
    ``DDIM_DISTRIBUTED=1`` instead lets JAX read them from the cluster's
    environment (SLURM, Open MPI, TPU pods, ...). Without either, a single
    process uses all its local devices.
    """
    if coordinator is None and os.environ.get("DDIM_DISTRIBUTED", "") not in ("1", "true", "yes"):
        return False
    if coordinator is not None and (num_processes is None or process_id is None):
        raise ParallelError("--coordinator needs --num-processes and --process-id")
    # CPU collectives across processes need an implementation (gloo ships with jaxlib); this only
    # concerns the CPU client, and must not query the backend (that would start it too early).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    # JAX's preemption notifier has just taken SIGTERM with a C++ handler that only records it; ddim
    # agrees on stops itself (ddim/train/stop.py), so SIGTERM goes back to ending the process until
    # the training loop installs its own handler.
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # not the main thread: signals are not ours to change
        pass
    return True


def data_mesh(devices=None) -> Mesh:
    """A 1-D mesh over all (global) devices, axis ``data``."""
    devices = np.asarray(devices if devices is not None else jax.devices())
    return Mesh(devices.reshape(-1), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharded(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def check_batch_size(batch_size: int, mesh: Mesh, what: str = "train.batch_size") -> None:
    devices = mesh.devices.size
    if batch_size % devices:
        raise ParallelError(f"{what} ({batch_size}) must be divisible by the number of devices ({devices})")
    if batch_size % jax.process_count():
        raise ParallelError(f"{what} ({batch_size}) must be divisible by the number of processes "
                            f"({jax.process_count()})")


def process_slice(batch_size: int) -> slice:
    """This process's rows of a global batch (contiguous, no overlap, nothing lost)."""
    per_process = batch_size // jax.process_count()
    start = jax.process_index() * per_process
    return slice(start, start + per_process)


def global_batch(local_batch, mesh: Mesh):
    """Assemble a global batch sharded along ``data`` from each process's local rows.

    ``local_batch`` is a pytree of arrays whose first axis is the batch (a dict
    ``{"image", "label"}``, or one array); the result has the same structure.
    """
    sharding = batch_sharded(mesh)
    return jax.tree.map(lambda rows: jax.make_array_from_process_local_data(sharding, rows), local_batch)


def replicate(tree, mesh: Mesh):
    """Place a pytree of (host or device) arrays replicated on every device of the mesh."""
    sharding = replicated(mesh)
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)
    return jax.tree.map(
        lambda x: jax.make_array_from_callback(np.shape(x), sharding, lambda index: np.asarray(x)[index]), tree
    )


def to_host(tree):
    """Fetch (possibly multi-host sharded) arrays to numpy on every process."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)
