"""ddim's benchmarks and studies, run from a clone of the repository as ``python -m benchmarks.KIND.NAME``.

- :mod:`benchmarks.speed`: how fast training, sampling, the input pipeline and the web page are.
- :mod:`benchmarks.studies`: how good samples are, and what changes it (samplers, guidance, recipes, fine-tuning).
- :mod:`benchmarks.release`: the bundled models rebuilt from their recipes, and the tools that made them.
- :mod:`benchmarks.faults`: the fault-injection campaign, and the injectors the tests share with it.

Not part of the installed ``ddim`` package; each module's docstring says how to run it.
"""
