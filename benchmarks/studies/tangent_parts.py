"""How large a model's derivative along its own sampling path is, part by part: what continuous-time consistency
distillation's tangent is made of.

Run:  python -m benchmarks.studies.tangent_parts [--model pretrained:flowers32] [--angles 0.4 0.8 1.2 1.5]
          [--num 8] [--guidance 1.5] [--out docs/results/tangent-parts.jsonl]

At each angle ``a`` of the schedule (signal rate ``cos a``, noise rate ``sin a``: ddim/distill/targets_consistency.py)
``--num`` images of the model's training split are noised to ``z``, and the model's velocity ``F(z, a)`` is
differentiated along the path ``dz/da = F`` (the guided velocity at ``--guidance``) in two parts, each one
``jax.jvp``: in the input, ``dF/dz . dz/da``, and in the angle at a fixed input, ``dF/da``. Their sum is the
``dF/da`` of the tangent (:func:`ddim.distill.targets_consistency.tangent_target`). Printed and written as one JSON
line per angle: the root mean square over images of each part's norm, beside ``|F|`` and ``|z|``, and the norm of
the angle part of the exact velocity field of the images themselves, ``(x cos a - z) / sin^2 a`` (the velocity of a
one-image dataset, differentiated by hand) for scale.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import ddim  # sets the XLA flags before JAX starts

from benchmarks.common import log


def parts(pipe, images, labels, angle: float, guidance: float) -> dict:
    """The norms of one angle's parts (module docstring) for normalised ``images``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ddim import ops
    from ddim.distill import targets_consistency as consistency
    from ddim.model import bind_denoiser

    cond = {"label": labels, "guidance": jnp.full(labels.shape, guidance, jnp.float32)}
    denoise = bind_denoiser(pipe.model, pipe.variables)
    velocity = consistency.velocity_of(lambda z, n, s: denoise(z, n, s, cond))
    noises = jax.random.normal(jax.random.key(0), images.shape, jnp.float32)
    angles = jnp.full((images.shape[0], 1, 1, 1), angle, jnp.float32)
    z = jnp.cos(angles) * images + jnp.sin(angles) * noises
    with ops.forward_mode():
        along = velocity(z, angles)
        _, in_input = jax.jvp(velocity, (z, angles), (along, jnp.zeros_like(angles)))
        _, in_angle = jax.jvp(velocity, (z, angles), (jnp.zeros_like(z), jnp.ones_like(angles)))
    exact = (images * jnp.cos(angles) - z) / jnp.square(jnp.sin(angles))

    def norm(values):
        return float(np.sqrt(np.mean(np.sum(np.square(np.asarray(values)), axis=(1, 2, 3)))))

    return {"angle": angle, "velocity": norm(along), "input_part": norm(in_input), "angle_part": norm(in_angle),
            "exact_angle_part": norm(exact), "state": norm(z)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pretrained:flowers32", help="pretrained:NAME, a run or a checkpoint")
    parser.add_argument("--angles", type=float, nargs="+", default=[0.4, 0.8, 1.2, 1.5])
    parser.add_argument("--num", type=int, default=8, help="images per angle")
    parser.add_argument("--guidance", type=float, default=1.5)
    parser.add_argument("--out", type=Path, default=None, help="append the lines to this JSON-lines file")
    args = parser.parse_args(argv)

    import jax.numpy as jnp

    import numpy as np

    from ddim.data import load_split
    from ddim.model import normalize
    from ddim.train.state import to_float

    pipe = ddim.load(args.model)
    batch = load_split(pipe.config, "train").batch(np.arange(args.num))
    images = normalize(pipe.model, pipe.variables, to_float(jnp.asarray(batch["image"])))
    labels = jnp.asarray(batch["label"], jnp.int32)
    for angle in args.angles:
        line = {"measured": datetime.date.today().isoformat(), "model": args.model, "guidance": args.guidance,
                "num": args.num, **parts(pipe, images, labels, angle, args.guidance)}
        log(" ".join(f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}"
                     for key, value in line.items()))
        if args.out:
            with args.out.open("a", encoding="utf-8") as file:
                file.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
