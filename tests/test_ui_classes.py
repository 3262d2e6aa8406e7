"""The web page of a class-conditional checkpoint: class pickers, the guidance slider, captions and commands."""

import json
import shlex

import numpy as np
import pytest
from PIL import Image

from ddim.sampling.classes import ClassSpace
from ddim.spec import SamplingSpec
from ddim.ui.checks import ANY_CLASS, check_class, check_guidance
from ddim.ui.command import class_argument
from ddim.ui.workbench import Limits, UIError, Upload, Workbench
from tests.conftest import CONDITIONAL_CLASSES
from tests.test_ui_workbench import RecordingPipeline, gradient, png_bytes

NAMES = ("daisy", "pink primrose", "sunflower")
SPACE = ClassSpace(True, NAMES, (1, 0, 3))


def stub_bench(classes=NAMES):
    pipeline = RecordingPipeline(classes, SPACE.counts)
    return pipeline, Workbench(pipeline, Limits(max_images=6, max_steps=8))


def test_a_picked_class_is_one_of_the_models():
    assert check_class("pink primrose", SPACE) == 1
    assert check_class("Sunflower", SPACE) == 2 and check_class(2, SPACE) == 2 and check_class("0", SPACE) == 0
    for any_class in (ANY_CLASS, None, "", " "):
        assert check_class(any_class, SPACE) is None
    # A name made of digits is that name, not the id it spells.
    assert check_class("2", ClassSpace(True, ("2", "daisy", "rose"))) == 0
    # A name this checkpoint does not have: most likely a page from before the server changed checkpoints.
    with pytest.raises(UIError, match=r"^class 'tulip' is not one of this checkpoint's 3 classes \(pick one from the "
                                      r"menu; reload the page if the server has changed checkpoints\)$"):
        check_class("tulip", SPACE)
    with pytest.raises(UIError, match="end class 7 is not one of"):
        check_class(7, SPACE, "end class")
    with pytest.raises(UIError, match=r"^this checkpoint is not class-conditional, so it takes no class \(got 'da"):
        check_class("daisy", ClassSpace(False))
    assert check_class(ANY_CLASS, ClassSpace(False)) is None
    check_guidance(SamplingSpec(guidance=3.0), SPACE)
    check_guidance(SamplingSpec(), ClassSpace(False))
    with pytest.raises(UIError, match=r"not class-conditional, so it takes no guidance scale \(got 2\)"):
        check_guidance(SamplingSpec(guidance=2.0), ClassSpace(False))


def test_the_command_names_a_class_as_the_command_line_reads_it():
    space = ClassSpace(True, ("2", "daisy", "pink primrose", "Daisy"))
    assert class_argument(space, 2) == "pink primrose"
    assert class_argument(space, 0) == "2"  # a name made of digits is that name on the command line
    # The command line folds case, and then "daisy" is the last of the two.
    assert class_argument(space, 3) == "Daisy" and class_argument(space, 1) == "1"


def test_a_chosen_class_and_the_guidance_reach_the_pipeline_the_captions_and_the_command():
    pipeline, bench = stub_bench()
    result = bench.sample(2, 3, 5, 0.0, "ddim", "uniform", class_name="pink primrose", guidance="2.5")
    verb, spec, classes = pipeline.calls[-1]
    assert verb == "generate" and classes == [1, 1] and spec == SamplingSpec(steps=3, guidance=2.5)
    assert result.captions[1] == "#1 · seed 5 · class pink primrose · 3 steps · ddim · uniform · guidance 2.5"
    assert result.command.endswith("--num 2 --seed 5 --class 'pink primrose' --steps 3 --sampler ddim "
                                   "--spacing uniform --eta 0 --guidance 2.5")
    # Guidance 1 (the slider's default) is written too: the command says every setting of the page.
    result = bench.trajectory(2, 2, 0, class_name="daisy", guidance=1)
    assert pipeline.calls[-1][0] == "trajectory" and pipeline.calls[-1][2] == [0, 0]
    assert result.command.startswith("ddim sample --trajectory ") and result.command.endswith(
        "--num 2 --seed 0 --class daisy --steps 2 --sampler ddim --spacing uniform --eta 0 --guidance 1")
    assert "Classes in the grid's order: daisy, daisy." in result.details
    result = bench.edit(Upload(png_bytes(gradient(8, 8)), "photo.png"), 0.5, 2, 3, class_name="sunflower", guidance=0)
    assert pipeline.calls[-1][0] == "edit" and pipeline.calls[-1][2] == [2] and pipeline.calls[-1][1].guidance == 0
    assert result.captions == ["strength 0.5 · seed 3 · class sunflower · 2 steps · ddim · uniform · guidance 0"]
    assert "--seed 3 --class sunflower --steps 2" in result.command and result.command.endswith("--guidance 0")


def test_any_class_draws_each_images_class_from_the_seed():
    pipeline, bench = stub_bench()
    result = bench.sample(6, 2, 11, class_name=ANY_CLASS, guidance=1)
    drawn = SPACE.resolve(None, 6, seed=11).tolist()
    assert pipeline.calls[-1][2] == drawn and 1 not in drawn  # "pink primrose" has no training images
    assert [c.split(" · ")[2] for c in result.captions] == [f"class {NAMES[i]}" for i in drawn]
    # The command leaves --class out: `ddim sample` without it draws the same classes from the seed.
    assert "--class" not in result.command and result.command.endswith("--guidance 1")
    assert bench.sample(6, 2, 11, class_name=None, guidance=1).captions == result.captions  # None is "any" too


def test_interpolation_goes_from_the_start_class_to_the_end_class():
    pipeline, bench = stub_bench()
    result = bench.interpolate(0, None, 3, None, 4, 2, "uniform", start_class="daisy", end_class="sunflower",
                               guidance=2)
    verb, spec, classes = pipeline.calls[-1]
    assert verb == "interpolate" and classes == [0, 2] and spec == SamplingSpec(steps=2, guidance=2.0)
    assert [c.split(" · ", 1)[1] for c in result.captions] == [
        "class daisy", "class daisy → sunflower", "class daisy → sunflower", "class sunflower"]
    assert result.command.endswith("--from 0 --to 3 --frames 4 --class daisy --class sunflower --steps 2 "
                                   "--spacing uniform --guidance 2")
    # "Any" at an end is the class its seed draws (that seed's single image on the Sample page).
    result = bench.interpolate(4, None, 9, None, 3, 2, start_class=ANY_CLASS, end_class="pink primrose")
    start = int(SPACE.resolve(None, 1, seed=4)[0])
    assert pipeline.calls[-1][2] == [start, 1] and result.captions[0] == f"frame 0 of 3 · class {NAMES[start]}"
    # One class at both ends: one --class.
    result = bench.interpolate(4, None, 9, None, 3, 2, start_class="daisy", end_class="daisy")
    assert result.command.count("--class daisy") == 1 and result.captions[1] == "frame 1 of 3 · class daisy"


@pytest.mark.parametrize("verb", ["sample", "trajectory", "interpolate", "edit"])
def test_a_stale_class_is_refused_before_anything_runs(verb):
    pipeline, bench = stub_bench()
    upload = Upload(png_bytes(gradient(8, 8)), "photo.png")
    calls = {
        "sample": lambda: bench.sample(2, 2, 0, class_name="tulip"),
        "trajectory": lambda: bench.trajectory(1, 2, 0, class_name="tulip"),
        "interpolate": lambda: bench.interpolate(0, None, 1, None, 3, 2, end_class="tulip"),
        "edit": lambda: bench.edit(upload, 0.5, 2, 0, class_name="tulip"),
    }
    with pytest.raises(UIError, match="'tulip' is not one of this checkpoint's 3 classes"):
        calls[verb]()
    assert pipeline.calls == []


def test_an_unconditional_checkpoint_takes_no_class_and_no_guidance_and_captions_none():
    pipeline, bench = stub_bench(classes=())
    with pytest.raises(UIError, match="not class-conditional, so it takes no class"):
        bench.sample(2, 2, 0, class_name="daisy")
    with pytest.raises(UIError, match="not class-conditional, so it takes no start class"):
        bench.interpolate(0, None, 1, None, 3, 2, start_class="daisy")
    with pytest.raises(UIError, match="not class-conditional, so it takes no guidance scale"):
        bench.trajectory(1, 2, 0, guidance=2)
    assert pipeline.calls == []
    # What the page's stand-ins send (None) changes nothing: the captions and command of before.
    result = bench.sample(2, 3, 5, 0.5, class_name=None, guidance=None)
    assert pipeline.calls[-1][2] is None and pipeline.calls[-1][1] == SamplingSpec(steps=3, eta=0.5)
    assert result.captions[0] == "#0 · seed 5 · 3 steps · ddim · uniform · eta 0.5"
    assert result.command.endswith("--num 2 --seed 5 --steps 3 --sampler ddim --spacing uniform --eta 0.5")
    result = bench.interpolate(0, None, 1, None, 3, 2, "uniform", start_class=None, end_class=None, guidance=None)
    assert pipeline.calls[-1][2] is None and result.captions == ["frame 0 of 3", "frame 1 of 3", "frame 2 of 3"]


# -- the page's controls (Gradio, no server) ----------------------------------------------------


def components(page, kind):
    return {block.elem_id: block for block in page.blocks.values() if isinstance(block, kind) and block.elem_id}


def test_the_page_has_a_searchable_class_picker_and_a_guidance_slider_on_every_generating_tab():
    from tests.ui_harness import require_ui

    require_ui()
    import gradio as gr

    from ddim.ui.page import build_page

    page = build_page(stub_bench()[1])
    pickers, sliders = components(page, gr.Dropdown), components(page, gr.Slider)
    for picker in ("sample-class", "interpolate-start-class", "interpolate-end-class", "edit-class", "inpaint-class",
                   "trajectory-class"):
        dropdown = pickers[picker]
        assert dropdown.filterable and dropdown.value == ANY_CLASS
        assert [value for _, value in dropdown.choices] == [ANY_CLASS, *NAMES]
        assert dropdown.choices[0][0].startswith("any")
    for tab in ("sample", "interpolate", "edit", "inpaint", "trajectory"):
        guidance = sliders[f"{tab}-guidance"]
        assert (guidance.minimum, guidance.value) == (0, 1) and guidance.maximum >= 4
    assert "reconstruct-class" not in pickers  # inversion and decoding take no class


def test_the_guidance_slider_names_the_measured_best_scale_of_a_bundled_model_only():
    from tests.ui_harness import require_ui

    require_ui()
    import gradio as gr

    from ddim.pretrained.registry import BEST_GUIDANCE
    from ddim.ui.controls import GUIDANCE_INFO
    from ddim.ui.page import build_page

    pipeline, bench = stub_bench()
    assert components(build_page(bench), gr.Slider)["sample-guidance"].info == GUIDANCE_INFO  # a run: unmeasured
    pipeline.pretrained = "flowers64"
    bench = Workbench(pipeline, Limits(max_images=6, max_steps=8))
    slider = components(build_page(bench), gr.Slider)["sample-guidance"]
    assert slider.value == 1  # it starts where `ddim sample` does; the advice is words, as the CLI's tip
    assert slider.info.endswith(f"; on flowers64, {BEST_GUIDANCE['flowers64']:g} scored the best FID")


def test_the_steps_slider_counts_a_guided_step_as_two_network_passes():
    from tests.ui_harness import require_ui

    require_ui()
    import gradio as gr

    from ddim.ui.page import build_page

    sliders = components(build_page(stub_bench()[1]), gr.Slider)
    for tab in ("sample", "interpolate", "edit", "inpaint", "trajectory"):  # the tabs with a guidance slider
        assert sliders[f"{tab}-steps"].label == "steps (network passes: steps, x2 with guidance other than 1)"
    assert sliders["reconstruct-steps"].label == "steps (one network pass each)"  # no guidance there
    unconditional = components(build_page(stub_bench(classes=())[1]), gr.Slider)
    assert unconditional["sample-steps"].label == "steps (one network pass each)"
    assert not any("per image" in slider.label for slider in sliders.values() if slider.label)


def test_a_consistency_students_page_offers_its_step_counts_and_samples_with_the_one_picked():
    from tests.ui_harness import require_ui

    require_ui()
    import gradio as gr

    from ddim.spec import SamplingRules
    from ddim.ui.page import build_page

    pipeline, bench = stub_bench()
    pipeline.rules = SamplingRules(SamplingSpec(steps=2, sampler="consistency", guidance=2.0), distilled_steps=4,
                                   guidance_range=(0.0, 4.0), step_counts=(1, 2, 4), sampler="consistency")
    page = build_page(bench)
    steps = components(page, gr.Dropdown)["sample-steps"]
    assert [value for _, value in steps.choices] == [1, 2, 4] and steps.value == 2
    assert "sample-steps" not in components(page, gr.Slider)
    bench.sample(2, 4, 0, 0.0, "consistency", "uniform", guidance="1.5")
    assert pipeline.calls[-1][1] == SamplingSpec(steps=4, sampler="consistency", guidance=1.5)
    # A student of one count keeps the fixed slider.
    pipeline.rules = SamplingRules(SamplingSpec(steps=4), distilled_steps=4, step_counts=(4,))
    slider = components(build_page(bench), gr.Slider)["sample-steps"]
    assert slider.value == 4 and not slider.interactive


def test_an_unconditional_page_has_no_picker_and_an_unchanged_api():
    from tests.ui_harness import require_ui

    require_ui()
    import gradio as gr

    from ddim.ui.page import build_page

    page = build_page(stub_bench(classes=())[1])
    assert not any(key.endswith(("-class", "-guidance")) for key in components(page, gr.components.Component))
    info = page.get_api_info()["named_endpoints"]
    assert [p["parameter_name"] for p in info["/sample"]["parameters"]] == [
        "num", "steps", "seed", "eta", "sampler", "spacing"]
    assert len(info["/interpolate"]["parameters"]) == 7 and len(info["/edit"]["parameters"]) == 7


# -- a real class-conditional checkpoint ---------------------------------------------------------


@pytest.fixture(scope="module")
def conditional_bench(conditional_workdir):
    import ddim

    return Workbench(ddim.load(conditional_workdir), Limits(max_images=6, max_steps=8))


@pytest.mark.slow
def test_the_page_gives_the_pixels_of_its_command_with_a_class_and_guidance(conditional_bench, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ddim.cli import app

    pipe = conditional_bench.pipeline
    assert pipe.classes == tuple(sorted(CONDITIONAL_CLASSES)) and "4 classes" in conditional_bench.card.markdown()
    picked = conditional_bench.sample(3, 2, 7, class_name="pink primrose", guidance=2.5)
    np.testing.assert_array_equal(picked.images, pipe.generate(3, steps=2, seed=7, classes="pink primrose",
                                                               guidance=2.5))
    drawn = conditional_bench.sample(3, 2, 7, class_name=ANY_CLASS, guidance=1)
    np.testing.assert_array_equal(drawn.images, pipe.generate(3, steps=2, seed=7))
    # The class named "2" is id 0; the command names it, and the command line reads a name before an id.
    digits = conditional_bench.sample(2, 2, 7, class_name="2", guidance=0)
    assert "--class 2" in digits.command and digits.captions[0].startswith("#0 · seed 7 · class 2 ·")
    monkeypatch.chdir(tmp_path)
    for name, result in (("picked", picked), ("drawn", drawn), ("digits", digits)):
        out = tmp_path / name
        outcome = CliRunner().invoke(app, shlex.split(result.command)[1:] + ["--out", str(out)],
                                     catch_exceptions=False)
        assert outcome.exit_code == 0, outcome.output
        files = [f"{i:04d}.png" for i in range(len(result.images))]
        written = np.stack([np.asarray(Image.open(out / f).convert("RGB")) for f in files])
        np.testing.assert_array_equal(written, result.images)
        recorded = json.loads((out / "classes.json").read_text())
        assert [f"class {recorded[f]['name']}" for f in files] == [c.split(" · ")[2] for c in result.captions]


@pytest.mark.slow
def test_a_real_interpolation_between_two_classes(conditional_bench):
    pipe = conditional_bench.pipeline
    result = conditional_bench.interpolate(1, None, 2, None, 3, 2, start_class="daisy", end_class="sunflower")
    a, b = pipe.latents(1, seed=1)[0], pipe.latents(1, seed=2)[0]
    np.testing.assert_array_equal(result.images, pipe.interpolate(a, b, frames=3, steps=2,
                                                                  classes=["daisy", "sunflower"], batch_size=64))
    assert result.captions[-1] == "frame 2 of 3 · class sunflower"
