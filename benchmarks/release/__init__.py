"""The bundled models: rebuilt from their recipes (:mod:`benchmarks.release.rebuild`, ``recipes/``), and the tools
that made and scored them (a dataset exported as a folder, samples made on one machine and scored on another,
weights stored in another dtype)."""
