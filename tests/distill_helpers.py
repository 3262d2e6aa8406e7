"""What the distillation tests share: a tiny random teacher, image batches, a few distillation steps, sampling,
and the ``ddim`` command's one-line errors and stop requests."""

import functools
import subprocess
import sys

import jax
import numpy as np

from ddim.distill import plan as plan_lib
from ddim.distill.step import StepSettings, create_student_state, distill_step
from ddim.model import DiffusionModel, bind_denoiser, init_variables
from ddim.sampling import process
from ddim.spec import SamplingSpec
from tests.conftest import REPO, run_once, tiny_config


BATCH = 16


def tiny_teacher(*overrides, scale=0.2):
    """A tiny teacher with random weights (its zero-initialised head made non-zero, each weight moved by ``scale``
    times a normal draw): any fixed denoiser can be distilled, and a random one gives targets that differ from step
    to step."""
    config = tiny_config(*overrides)
    model = DiffusionModel(config.model)
    variables = jax.device_get(run_once(lambda key: init_variables(model, key), jax.random.key(1)))

    def moved(params, key):
        leaves, tree = jax.tree.flatten(params)
        keys = jax.random.split(key, len(leaves))
        return jax.tree.unflatten(tree, [leaf + scale * jax.random.normal(key, leaf.shape)
                                         for key, leaf in zip(keys, leaves)])

    # In one program: leaf by leaf, op by op, each new shape compiles on its own (20 s on two cores).
    params = jax.device_get(run_once(moved, variables["params"], jax.random.key(2)))
    return config, model, {"params": params, "batch_stats": variables["batch_stats"]}


def image_batches(seed=0, conditional=False):
    rng = np.random.default_rng(seed)
    while True:
        # Smooth colour fields: something image-like for the normaliser and the noise to act on.
        base = rng.uniform(0, 255, (BATCH, 4, 4, 3))
        images = np.repeat(np.repeat(base, 4, axis=1), 4, axis=2).astype(np.uint8)
        labels = rng.integers(0, 4, BATCH).astype(np.int32) if conditional else np.zeros(BATCH, np.int32)
        yield {"image": images, "label": labels}


def distil(teacher_model, teacher_variables, config, phase, steps, conditional=False, final_state=False):
    student = DiffusionModel(plan_lib.student_model(teacher_model.config, config, phase))
    state = create_student_state(student, teacher_variables, config, phase, jax.random.key(3))
    settings = StepSettings.of(student, teacher_model, config, phase)
    step = jax.jit(lambda s, b, r: distill_step(s, teacher_variables, b, r, settings))
    batches = image_batches(conditional=conditional)
    for _ in range(steps):
        state, _ = step(state, next(batches), jax.random.key(4))
    if final_state:
        return student, state
    return student, {"params": state.ema_params, "batch_stats": state.ema_batch_stats}


@functools.partial(jax.jit, static_argnums=0)
def jit_denoise(model, variables, noisy, noise_rates, signal_rates, cond=None):
    """``bind_denoiser(model, variables)`` compiled once per model and shapes: run op by op, a tiny UNet takes
    seconds a call."""
    return bind_denoiser(model, variables)(noisy, noise_rates, signal_rates, cond)


def sample_images(model, variables, steps, cond=None, count=32, sampler="ddim"):
    spec = SamplingSpec(steps=steps, sampler=sampler)
    return np.asarray(process.generate(model, variables, jax.random.key(7), count, spec, cond=cond))


def distil_recording_starts(teacher_dir, out, overrides):
    """``ddim distill``'s function on ``teacher_dir`` into ``out``: ``(result, log lines, starts)``, ``starts`` the
    weights each phase's first state was made from, by phase kind."""
    import pytest

    from ddim.distill import distill, loop

    lines, starts = [], {}
    real_state = loop.create_student_state

    def recording(student, weights, config, phase, *args):
        starts[phase.kind] = jax.device_get(weights["params"])
        return real_state(student, weights, config, phase, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "create_student_state", recording)
        result = distill(teacher_dir, out, overrides=overrides, log=lines.append)
    return result, lines, starts


def _ddim(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ddim.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


def each_one_error_line(cases):
    """Every ``(args, message)`` command fails with one ``error:`` line holding ``message``, no traceback."""
    for args, message in cases:
        result = _ddim(*args, cwd=REPO)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith("error:") and message in lines[-1], result.stderr
        assert "Traceback" not in result.stderr


def stop_at_call(monkeypatch, count: int) -> None:
    """SIGTERM (as a stop request) in the ``count``-th distillation step of the next run."""
    import os
    import signal

    from ddim.distill import loop

    real, calls = loop.compiled_step, {"n": 0}

    def stopping(settings_, mesh):
        step = real(settings_, mesh)

        def wrapped(*args):
            calls["n"] += 1
            if calls["n"] == count:
                os.kill(os.getpid(), signal.SIGTERM)
            return step(*args)

        return wrapped

    monkeypatch.setattr(loop, "compiled_step", stopping)


def stopped_and_resumed_student(teacher_workdir, root, monkeypatch, overrides, stop: int, total: int):
    """Distil ``overrides`` straight to ``root/straight`` and, stopped after ``stop`` steps and resumed, to
    ``root/resumed``; assert the two final students' weights are equal, and return the resumed one's directory."""
    import jax
    import numpy as np

    from ddim.checkpoint import load_ema
    from ddim.distill import distill

    distill(teacher_workdir, root / "straight", overrides=overrides, log=lambda m: None)
    stop_at_call(monkeypatch, stop)
    stopped = distill(teacher_workdir, root / "resumed", overrides=overrides, log=lambda m: None)
    assert stopped.interrupted and stopped.final_step == stop
    monkeypatch.undo()
    resumed = distill(teacher_workdir, root / "resumed", overrides=overrides, log=lambda m: None)
    assert (resumed.start_step, resumed.final_step) == (stop, total)

    def final(run):
        return load_ema(run / "students" / "consistency").variables["params"]

    jax.tree.map(np.testing.assert_array_equal, final(root / "straight"), final(root / "resumed"))
    return root / "resumed" / "students" / "consistency"


def consistency_step_inputs(config, step: int = 0):
    """What a consistency step's loss takes for a tiny velocity student of ``config``: ``(settings, params, bound,
    state, images, noises)``, ``bound(params)`` its unconditional denoiser and ``state`` the two fields the loss
    reads."""
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp
    import numpy as np

    from ddim.distill import plan as plan_lib
    from ddim.distill.step import StepSettings
    from ddim.model import DiffusionModel, bind_denoiser, init_variables

    (phase,) = plan_lib.plan(config.model, config)
    student = DiffusionModel(plan_lib.student_model(config.model, config, phase))
    settings = StepSettings.of(student, DiffusionModel(config.model), config, phase)
    variables = init_variables(student, jax.random.key(0))

    def bound(params):
        denoise = bind_denoiser(student, {"params": params, "batch_stats": variables["batch_stats"]})
        return lambda z, n, s: denoise(z, n, s, None)

    state = SimpleNamespace(params=variables["params"], step=jnp.asarray(step))
    images = jnp.asarray(np.random.default_rng(1).normal(size=(4, 16, 16, 3)), jnp.float32)
    noises = jnp.asarray(np.random.default_rng(2).normal(size=(4, 16, 16, 3)), jnp.float32)
    return settings, variables["params"], bound, state, images, noises
