"""What the bundled-model tests share: ``tiny16``, exported from the tiny trained checkpoint into a directory of
bundled models, and the registry pointed at it."""

import shutil

import pytest

from ddim.pretrained import ENV, export_checkpoint


NAME = "tiny16"


@pytest.fixture(scope="module")
def bundles(trained_workdir, tmp_path_factory):
    """A directory of bundled models holding ``tiny16``, exported from the tiny checkpoint (step 6)."""
    root = tmp_path_factory.mktemp("bundles")
    export_checkpoint(trained_workdir, NAME, root=root, hardware="a 2-core CPU", recipe="smoke + tests' TINY")
    return root


@pytest.fixture
def use_bundles(bundles, monkeypatch):
    """Point the registry (``pretrained:NAME``, ``--pretrained``, the fallback) at ``bundles``."""
    monkeypatch.setenv(ENV, str(bundles))
    return bundles


def copy_bundles(bundles, tmp_path):
    root = tmp_path / "bundles"
    shutil.copytree(bundles, root)
    return root
