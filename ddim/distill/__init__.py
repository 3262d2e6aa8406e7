"""Distillation: students that sample in 1 to N steps, made from a diffusion model (progressive or consistency).

- :mod:`~ddim.distill.targets`: the maths (grid times, the two-step target, the guided target, the loss).
- :mod:`~ddim.distill.targets_consistency`: consistency distillation's maths (the boundary, the teacher's ODE
  step, the loss).
- :mod:`~ddim.distill.plan`: a run's phases (stage one, halving rounds, or the one consistency phase) and each
  student's model config.
- :mod:`~ddim.distill.step`: the student's state and the jitted distillation step.
- :mod:`~ddim.distill.loop`: ``distill(teacher, workdir)``, setting a run up and training phase after phase.
"""

from ddim.distill.loop import DistillResult, distill, run_config

__all__ = ["DistillResult", "distill", "run_config"]
