"""Counting what JAX compiles (ddim.compilation.counting_compilations), against the session's persistent cache."""

import jax
import jax.numpy as jnp

from ddim.compilation import counting_compilations
from ddim.ui.device import DeviceSlot, Setup, first_request_status


def cube_plus(x):
    return x**3 + 0.25 * x  # a program no other test compiles


def test_a_new_program_is_compiled_and_then_read_from_the_persistent_cache():
    x = jnp.arange(7.0)  # built before counting: only the function's own program is counted
    # Cache every program, however quick its compile (ddim's own threshold skips the quick ones).
    previous = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    try:
        with counting_compilations() as first:
            jax.jit(cube_plus)(x).block_until_ready()
        jax.clear_caches()  # forget the compiled program in memory, as a restarted process has
        with counting_compilations() as again:
            jax.jit(cube_plus)(x).block_until_ready()
        with counting_compilations() as reused:
            jax.jit(cube_plus)(x).block_until_ready()
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", previous)
    assert (first.compiled, first.from_cache) == (1, 0)
    assert (again.compiled, again.from_cache) == (0, 1)
    assert reused.built == 0


def test_a_request_says_what_its_time_includes():
    slot, messages = DeviceSlot(), []
    _, _, setup = slot.run("shape", "2 images", messages.append, lambda: jax.jit(lambda v: v * 5.5 - 1)(jnp.ones(3)))
    _, _, again = slot.run("shape", "2 images", messages.append, lambda: None)
    assert setup.first_of_shape and setup.compiled >= 1 and not again.first_of_shape
    assert messages[0] == first_request_status("2 images") and messages[1] == "running 2 images..."
    assert "including compiling" in setup.note() and again.note() == ""
    assert "compilation cache" in Setup(True, compiled=0, from_cache=2).note()


def test_a_first_request_says_it_compiles_or_may_only_read_the_compilation_cache(tmp_path):
    directory = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert first_request_status("2 images").startswith("compiling for 2 images (first request of this shape")
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        assert first_request_status("2 images").startswith("preparing 2 images: compiling, or reading the "
                                                           "compilation cache")
    finally:
        jax.config.update("jax_compilation_cache_dir", directory)
