"""Run in a subprocess by test_parallel.py, with XLA_FLAGS forcing N host devices (must precede JAX).

Usage: python -m tests.multidevice_worker MODE ARGS_JSON; prints one JSON line with the results.
"""

import json
import sys

import ddim  # noqa: F401  (XLA flags first)
import jax
import numpy as np


def step_mode(args):
    """A few train steps from a fixed state and batch: losses, checksums, sharding of the batch."""
    from ddim import parallel
    from ddim.train import state as train_lib
    from tests.conftest import tiny_config

    config = tiny_config()
    mesh = parallel.data_mesh()
    state = train_lib.create_train_state(config, jax.random.key(0), mesh=mesh)
    step_fn, _ = train_lib.compiled_steps(config, mesh)
    rng = np.random.default_rng(0)
    losses = []
    for i in range(3):
        local = {"image": rng.integers(0, 256, (8, 16, 16, 3), dtype=np.uint8), "label": np.arange(8, dtype=np.int32)}
        batch = parallel.global_batch(local, mesh)
        images = batch["image"]
        shards = len(images.addressable_shards)
        shard_rows = images.addressable_shards[0].data.shape[0]
        label_rows = batch["label"].addressable_shards[0].data.shape[0]
        state, metrics = step_fn(state, batch, jax.random.key(1))
        losses.append(float(metrics["noise_loss"]))
    params = jax.tree.leaves(jax.device_get(state.params))
    stats = jax.tree.leaves(jax.device_get(state.batch_stats))
    return {
        "devices": jax.device_count(),
        "losses": losses,
        "params": [float(np.sum(np.abs(p))) for p in params],
        "batch_stats": [float(np.sum(s)) for s in stats],
        "batch_spec": list(images.sharding.spec),
        "shards": shards,
        "shard_rows": shard_rows,
        "label_rows": label_rows,
        "state_replicated": all(x.sharding.is_fully_replicated for x in jax.tree.leaves(state)),
    }


def train_mode(args):
    """ddim.train.train on mock data up to args['max_steps'] in args['workdir']."""
    from ddim.train import train
    from tests.conftest import mock_flowers, tiny_config

    overrides = [f"train.max_steps={args['max_steps']}", "train.log_every=1", "train.eval_every=0"]
    overrides += args.get("overrides", [])
    # With "log": progress lines on stdout ("LOG ..."), for a test that acts at a given step.
    log = (lambda m: print(f"LOG {m}", flush=True)) if args.get("log") else (lambda m: None)
    try:
        with mock_flowers():
            result = train(tiny_config(*overrides), args["workdir"], log=log)
    except Exception as error:  # reported to the test, which checks the message
        return {"error": f"{type(error).__name__}: {error}"}
    params = jax.tree.leaves(jax.device_get(result.state.params))
    return {
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "start": result.start_step,
        "final": result.final_step,
        "interrupted": result.interrupted,
        "metrics": result.last_metrics,
        "params": [float(np.sum(np.abs(p))) for p in params],
    }


def tools_mode(args):
    """Every Pipeline verb of a tiny random model on the mesh: checksums of the outputs."""
    from ddim.model import DiffusionModel, init_variables
    from ddim.sampling import Pipeline
    from tests.conftest import tiny_config

    config = tiny_config()
    model = DiffusionModel(config.model)
    variables = init_variables(model, jax.random.key(0))
    # A non-zero head so the outputs depend on the network.
    variables = {**variables, "params": jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape) if "head" in str(path) else x,
        variables["params"])}
    pipe = Pipeline(config, variables)
    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    mask = np.zeros((16, 16), bool)
    mask[4:12, 4:12] = True
    # Batches of 4 (split over the devices) and, for generate, a last batch of 2 (replicated on 4 devices).
    outputs = {
        "generate": pipe.generate(6, steps=3, seed=1, batch_size=4, sampler="dpmpp-2m", spacing="logsnr"),
        "latents": pipe.invert(images, steps=3),
        "edit": pipe.edit(images, strength=0.5, steps=2, seed=2),
        "inpaint": pipe.inpaint(images, mask, steps=2, seed=3),
        "trajectory": pipe.trajectory(4, steps=2, seed=4),
    }
    return {"devices": jax.device_count(),
            **{name: float(np.abs(np.asarray(value, np.float64)).sum()) for name, value in outputs.items()}}


def distributed_mode(args):
    """One of several processes: initialise jax.distributed, then train like train_mode."""
    from ddim import parallel

    parallel.initialize_distributed(args["coordinator"], args["num_processes"], args["process_id"])
    return train_mode(args)


if __name__ == "__main__":
    mode, raw = sys.argv[1], json.loads(sys.argv[2])
    result = {"step": step_mode, "train": train_mode, "distributed": distributed_mode, "tools": tools_mode}[mode](raw)
    print("RESULT " + json.dumps(result), flush=True)
