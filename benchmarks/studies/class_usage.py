"""How much a class-conditional model uses the class: its denoising error with the right, no and a wrong class.

Classifier-free guidance can only amplify what the class changes in the network's prediction. This measures it
directly, without sampling or the FID Inception: real validation images (the model's own data config, with
their labels) are noised at fixed diffusion times with fixed noise, and the model estimates the clean image
three times, told the image's class, the null class (no class) and a wrong class (each label shifted by a
fixed, seeded nonzero offset). It prints, per time and overall, the mean squared error of the clean-image
estimate (in the normaliser's units) for each, and the class gain, the share of the no-class error that the
right class removes: ``1 - err(right) / err(null)``. A model that ignores its class has a gain of 0 and the same
error with a wrong class; one that uses it has a positive gain and a wrong-class error above the no-class error.
Cheap (three forward passes per image and time): minutes on a CPU for a 32x32 model.

    python -m benchmarks.studies.class_usage --pretrained flowers32
    python -m benchmarks.studies.class_usage --checkpoint runs/flowers32 --num 512 --json /tmp/usage.json
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import numpy as np

from benchmarks.common import log

TIMES = (0.1, 0.3, 0.5, 0.7, 0.9)
"""Diffusion times (0 clean, 1 pure noise) at which the error is measured."""


def real_validation(config, num: int):
    """The first ``num`` validation images of the model's data config and their labels as the model's class ids.

    Labels are matched to the model's classes by name, as ``ddim eval`` does (its ``as_model_ids``): a bundled
    model trained on a folder export of a TFDS dataset lists the classes in another order than the dataset.
    """
    from ddim import data as data_lib
    from ddim.evaluation.conditional import ClassPlan, as_model_ids

    data = data_lib.load(config, None, ("val",), log=log, check=False)
    if data.val is None or data.val.labels is None:
        raise SystemExit("error: the model's data has no labelled validation split")
    count = min(num, len(data.val))
    plan = ClassPlan(config.model.class_names, None, 1.0)
    labels = as_model_ids(plan, np.asarray(data.val.labels[:count]), data.class_names)
    return np.asarray(data.val[:count]), labels


def wrong_labels(labels: np.ndarray, num_classes: int, seed: int) -> np.ndarray:
    """Each label moved by a seeded offset in ``[1, num_classes)``: always another class."""
    offsets = np.random.default_rng(seed).integers(1, num_classes, size=labels.shape)
    return (labels + offsets) % num_classes


@functools.lru_cache(maxsize=4)
def compiled_errors(model_config):
    """``errors(variables, images, labels, wrong, time, key)``: the clean-image errors with the right, null and
    wrong class, compiled once per model shape (the variables are an argument, so any weights reuse it)."""
    import jax
    import jax.numpy as jnp

    from ddim.model import DiffusionModel

    model = DiffusionModel(model_config)

    @jax.jit
    def errors(variables, batch_images, batch_labels, batch_wrong, time, key):
        clean = model.apply(variables, batch_images, method=DiffusionModel.normalize)
        noise = jax.random.normal(key, clean.shape)
        noise_rates, signal_rates = model.apply(variables, jnp.full((clean.shape[0], 1, 1, 1), time),
                                                method=DiffusionModel.schedule)
        noisy = signal_rates * clean + noise_rates * noise

        def error(label):
            _, estimate = model.apply(variables, noisy, noise_rates, signal_rates, False, {"label": label},
                                      method=DiffusionModel.denoise)
            return jnp.mean((estimate - clean) ** 2, axis=(1, 2, 3))

        return error(batch_labels), error(jnp.full_like(batch_labels, -1)), error(batch_wrong)

    return errors


def class_usage(pipe, images: np.ndarray, labels: np.ndarray, times=TIMES, batch_size: int = 128,
                seed: int = 0) -> dict:
    """Clean-image errors with the right, null and wrong class at each of ``times``, and the class gain."""
    import jax
    import jax.numpy as jnp

    if not pipe.config.model.class_conditional:
        raise SystemExit("error: the model is not class-conditional (trained without model.class_conditional)")
    variables = pipe.variables
    wrong = wrong_labels(labels, pipe.config.model.num_classes, seed)
    errors = compiled_errors(pipe.config.model)

    rows = []
    for index, time in enumerate(times):
        sums = np.zeros(3)
        for start in range(0, len(images), batch_size):
            stop = start + batch_size
            key = jax.random.fold_in(jax.random.PRNGKey(seed), index * 1_000_003 + start)
            batch_images = jnp.asarray(images[start:stop], jnp.float32) / 255.0
            parts = errors(variables, batch_images, jnp.asarray(labels[start:stop]), jnp.asarray(wrong[start:stop]),
                           jnp.float32(time), key)
            sums += [float(np.sum(part)) for part in parts]
        right, null, other = sums / len(images)
        rows.append({"time": time, "right": right, "null": null, "wrong": other, "gain": 1.0 - right / null})
    right, null, other = (float(np.mean([row[name] for row in rows])) for name in ("right", "null", "wrong"))
    return {"images": int(len(images)), "times": list(times), "rows": rows,
            "overall": {"right": right, "null": null, "wrong": other, "gain": 1.0 - right / null}}


def table(result: dict) -> str:
    lines = ["| time | right class | no class | wrong class | class gain |", "|---|---|---|---|---|"]
    for row in [*result["rows"], {"time": "all", **result["overall"]}]:
        lines.append(f"| {row['time']} | {row['right']:.5f} | {row['null']:.5f} | {row['wrong']:.5f} | "
                     f"{100 * row['gain']:.2f} % |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--checkpoint", help="work dir, checkpoints dir or step dir")
    group.add_argument("--pretrained", metavar="NAME", help="a model bundled with ddim (`ddim pretrained` lists them)")
    parser.add_argument("--num", type=int, default=512, help="validation images (default 512)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the noise and the wrong classes")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()

    import ddim

    pipe = ddim.load(f"pretrained:{args.pretrained}" if args.pretrained else args.checkpoint)
    images, labels = real_validation(pipe.config, args.num)
    log(f"{len(images)} validation images, {pipe.config.model.num_classes} classes, step {pipe.step}")
    result = class_usage(pipe, images, labels, seed=args.seed)
    result["model"] = args.pretrained or args.checkpoint
    result["step"] = pipe.step
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
