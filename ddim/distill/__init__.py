"""Distillation: students that sample in 1 to N steps, made from a diffusion model (progressive or consistency).

- :mod:`~ddim.distill.targets`: the maths (grid times, the two-step target, the guided target, the loss).
- :mod:`~ddim.distill.targets_consistency`: consistency distillation's maths (the boundary, the teacher's ODE
  step, the loss; consistency tuning's and mid-training's).
- :mod:`~ddim.distill.plan`: a run's phases (stage one, halving rounds, or consistency mid-training and the
  consistency phase) and each student's model config.
- :mod:`~ddim.distill.settings`: a run's config and the work directory's record of its teacher.
- :mod:`~ddim.distill.bank`: consistency mid-training's banked teacher trajectories (solved, stored, drawn from).
- :mod:`~ddim.distill.step`: the student's state and the jitted distillation steps.
- :mod:`~ddim.distill.loop`: ``distill(teacher, workdir)``, setting a run up and training phase after phase.
"""

from ddim.distill.loop import DistillResult, distill, run_config

__all__ = ["DistillResult", "distill", "run_config"]
