"""Your own folder, with and without classes: the commands the user guide gives build the recipe they promise.

ddim/configs/folder64.toml is the Keras reference for a folder; by class it must give the network ADM's class
embedding (the one it uses) instead of the small vectors it hardly uses, and say in one line what else that
needs. The bundled flowers64's recipe on a folder (ddim/configs/flowers64-fast.toml) trains by class the same way.
"""

from __future__ import annotations

import dataclasses

import jax
import pytest
from flax import traverse_util

from ddim.checkpoint.locate import model_config_mismatch
from ddim.config import ConfigError, load_config
from ddim.model import DiffusionModel, init_variables
from tests.conftest import CONFIGS, TINY

FOLDER = 'data.image_dir="photos"'
BY_CLASS = ("model.class_conditional=true", "model.num_classes=3", 'model.class_names=["a", "b", "c"]',
            "model.class_counts=[4, 4, 4]")


def folder_config(name: str, *overrides: str):
    return load_config(CONFIGS / name, [FOLDER, *overrides])


def test_the_folder_config_without_classes_is_the_keras_reference_network():
    folder = folder_config("folder64.toml")
    reference = load_config(CONFIGS / "flowers64.toml")
    assert not folder.model.class_conditional and folder.model.embedding_injection == "input"
    assert dataclasses.replace(folder.model, class_embedding=reference.model.class_embedding) == reference.model
    # A run started before the config named a class embedding resumes: an unconditional model has none.
    older = dataclasses.replace(folder, model=dataclasses.replace(folder.model, class_embedding="noise-features"))
    assert model_config_mismatch(older, folder) is None


def test_the_folder_config_by_class_says_in_one_line_what_adm_needs():
    with pytest.raises(ConfigError) as caught:
        folder_config("folder64.toml", *BY_CLASS)
    message = str(caught.value)
    assert "\n" not in message and "add --set model.embedding_injection=every-block to train by class" in message


@pytest.mark.parametrize("name, extra", [("folder64.toml", ("model.embedding_injection=every-block",)),
                                         ("flowers64-fast.toml", ())])
def test_a_folder_by_class_trains_the_class_embedding_the_network_uses(name, extra):
    config = folder_config(name, *BY_CLASS, *extra, *TINY)
    assert (config.model.class_embedding, config.model.embedding_injection) == ("adm", "every-block")
    shapes = jax.eval_shape(lambda: init_variables(DiffusionModel(config.model), jax.random.key(0)))
    tables = [leaf.shape for path, leaf in traverse_util.flatten_dict(shapes["params"]).items() if "classes" in path]
    # ADM's vectors: one per class and the null class, as wide as the block embedding (4 x embedding_dims).
    assert tables == [(4, 4 * config.model.embedding_dims)]
