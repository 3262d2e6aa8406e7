"""Run in a child process by tests/test_rebuild.py: one command of a recipe, on TFDS mock data and with the tiny
random network in place of the standard FID Inception, as the rebuild runs it otherwise.

Usage: python -m tests.rebuild_worker MODULE ARGS...   (what ``python -m MODULE ARGS...`` runs)
"""

import runpy
import sys

MOCK_EXAMPLES = 24  # per split expression: a few batches of the smoke recipes


def main() -> None:
    module, *args = sys.argv[1:]
    import tensorflow_datasets as tfds

    from ddim.evaluation import fid_inception
    from tests.tiny_fid import tiny_extractor

    fid_inception.standard_factory = lambda *args, **kwargs: tiny_extractor
    sys.argv = [module, *args]
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
