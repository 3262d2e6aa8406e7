"""The controls the page's tabs share: steps, sampler, class and guidance, seed, uploads, results.

Each takes the tab's name, which prefixes its ``elem_id`` (the browser tests find controls by it).
"""

from __future__ import annotations

import gradio as gr

from ddim.pretrained.registry import best_guidance
from ddim.spec import FEW_STEPS, FEW_STEPS_BEST, FID_BEST_SPACING, SAMPLERS, SPACINGS, SamplingSpec
from ddim.ui.checks import ANY_CLASS, MAX_ETA, MAX_SEED
from ddim.ui.workbench import Workbench

# The controls start at the spec's defaults, as `ddim sample` without options.
DEFAULTS = SamplingSpec()
# The advice follows the FID of samples, as the CLI's tip does (ddim.spec, FID_BEST_SPACING and FEW_STEPS_BEST).
SAMPLER_INFO = (f"by the FID of samples: level at 20 steps; with {FEW_STEPS} or fewer, {FEW_STEPS_BEST[0]} "
                f"(on the {FEW_STEPS_BEST[1]} grid) scores best")
SPACING_INFO = (f"the time grid: {FID_BEST_SPACING} in t (DDIM's; the safe one by FID at 20 steps), in log-SNR (best "
                f"at 5-{FEW_STEPS} steps with {FEW_STEPS_BEST[0]}), or Karras'")
# The guidance slider's range (the scale itself may be any number >= 0, as `ddim sample --guidance`).
MAX_GUIDANCE_SHOWN = 8.0
GUIDANCE_INFO = "classifier-free guidance: 1 is plain conditional sampling, 0 ignores the class, above 1 more like it"
ANY_CLASS_LABEL = "any: drawn from the seed, as often as in the training data"


STEPS_LABEL = "steps (one network pass each)"
GUIDED_STEPS_LABEL = "steps (network passes: steps, x2 with guidance other than 1)"
FIXED_STEPS_LABEL = "steps (the distilled model's own count, its only one)"
STUDENT_STEPS_LABEL = "steps (the distilled model's own counts, one network pass each)"


def steps_slider(tab: str, limit: int, value: int = DEFAULTS.steps, fixed: bool = False, guided: bool = False,
                 counts: tuple[int, ...] = ()):
    """The steps slider; ``guided``: the tab has a guidance control, and a scale other than 1 costs each step a
    second network pass (the unconditional prediction; a distilled student is ``fixed``, one pass a step).

    A student of several step ``counts`` (a consistency student: 1, 2 or 4) gets a menu of those instead, since
    a slider would offer counts it refuses."""
    if fixed and len(counts) > 1:
        return gr.Dropdown(list(counts), value=value, label=STUDENT_STEPS_LABEL, elem_id=f"{tab}-steps")
    label = FIXED_STEPS_LABEL if fixed else GUIDED_STEPS_LABEL if guided else STEPS_LABEL
    return gr.Slider(1, max(limit, value) if fixed else limit, value=value if fixed else min(value, limit), step=1,
                     label=label, interactive=not fixed, elem_id=f"{tab}-steps")


def sampler_controls(tab: str, limit: int, stochastic: bool = True, workbench: Workbench | None = None,
                     guidance: bool = True):
    """Steps, sampler, spacing and (for the verbs that take it) eta; returns them in the verbs' order.
    ``guidance``: the tab has a guidance control (for a class-conditional model), which the steps label counts.

    They start at the model's defaults (``workbench.pipeline.defaults``: a bundled model's best setting; for the
    deterministic verbs, DDIM's uniform grid), as the command line without options; a distilled student's are
    fixed at its own sampler, and its steps at its own count (a menu of its counts when it has several).
    """
    defaults, fixed, guided, counts = DEFAULTS, False, False, ()
    if workbench is not None:
        from ddim.sampling.pipeline import inversion_spec

        rules = workbench.pipeline.rules
        defaults = rules.defaults if stochastic else inversion_spec(None, rules=rules)
        fixed = rules.distilled
        guided = guidance and bool(workbench.pipeline.classes)
        counts = rules.step_counts
    steps = steps_slider(tab, limit, defaults.steps, fixed, guided, counts)
    with gr.Row():
        # The consistency sampler is a consistency student's only one, and no diffusion model's.
        choices = [name for name, kind in SAMPLERS.items() if kind.consistency == SAMPLERS[defaults.sampler].consistency]
        sampler = gr.Dropdown(choices, value=defaults.sampler, label="sampler", info=SAMPLER_INFO,
                              elem_id=f"{tab}-sampler", visible=stochastic, interactive=not fixed)
        spacing = gr.Dropdown(list(SPACINGS), value=defaults.spacing, label="spacing", info=SPACING_INFO,
                              elem_id=f"{tab}-spacing", interactive=not fixed)
    # A progressive student's DDIM steps take eta too; a consistency student's sampler draws its own noise.
    takes_eta = not fixed or SAMPLERS[defaults.sampler].stochastic
    eta = gr.Slider(0, MAX_ETA, value=defaults.eta, step=0.05, label="eta (0: deterministic; 1: DDPM-like; ddim only)",
                    elem_id=f"{tab}-eta", visible=stochastic and takes_eta)
    return steps, sampler, spacing, eta


def class_controls(workbench: Workbench, tab: str, pickers=(("class", "class"),)):
    """The class picker(s) (``(id suffix, label)`` each) and the guidance slider; returns them in that order.

    A checkpoint without classes gets none of them: stand-ins that hold None
    take their places in the handlers' inputs (and are no part of the page's API).
    """
    if not workbench.classes.conditional:
        return [gr.State(None) for _ in range(len(pickers) + 1)]
    choices = [(ANY_CLASS_LABEL, ANY_CLASS)] + [(name, name) for name in workbench.classes.names]
    info = f"{len(workbench.classes.names)} classes; type to search"
    with gr.Row():
        controls = [gr.Dropdown(choices, value=ANY_CLASS, filterable=True, label=label, info=info,
                                elem_id=f"{tab}-{suffix}") for suffix, label in pickers]
    rules = workbench.pipeline.rules
    low, high = rules.guidance_range or (0.0, MAX_GUIDANCE_SHOWN)
    start = rules.defaults.guidance if rules.defaults.guidance is not None else 1.0
    guidance = gr.Slider(low, high, value=start, step=0.25, label="guidance scale",
                         info=guidance_info(workbench.card.pretrained), elem_id=f"{tab}-guidance")
    return [*controls, guidance]


def guidance_info(pretrained: str | None) -> str:
    """The slider's help line; on a bundled model whose best scale was measured, it names that scale.

    The slider still starts at 1, as ``ddim sample`` without ``--guidance`` (which prints the same advice as a tip).
    """
    best = best_guidance(pretrained)
    return GUIDANCE_INFO if best is None else f"{GUIDANCE_INFO}; on {pretrained}, {best:g} scored the best FID"


def seed_field(tab: str, label: str = "seed"):
    """A seed field with a random-seed button (no server round trip)."""
    with gr.Row(equal_height=True):
        seed = gr.Number(value=0, precision=0, minimum=0, maximum=MAX_SEED, label=label, scale=3,
                         elem_id=f"{tab}-seed")
        dice = gr.Button("random seed", size="sm", scale=1, elem_id=f"{tab}-random-seed")
    dice.click(None, None, seed, js=f"() => Math.floor(Math.random() * {MAX_SEED + 1})", api_visibility="private")
    return seed


def upload_field(tab: str, label: str = "image"):
    return gr.Image(label=label, type="filepath", sources=["upload", "clipboard"], format="png",
                    elem_id=f"{tab}-upload", elem_classes=["pixelated"], height=300)


def shown_image(label: str, tab: str, name: str):
    return gr.Image(label=label, interactive=False, format="png", buttons=["download", "fullscreen"],
                    elem_id=f"{tab}-{name}", elem_classes=["pixelated", "enlarged"], height=300)


def gallery(tab: str, label: str, columns: int = 8):
    # "fit-content": as tall as its images (Gradio's "auto" is a fixed height with a scrollbar).
    return gr.Gallery(label=label, columns=columns, format="png", object_fit="contain", height="fit-content",
                      buttons=["download", "download_all", "fullscreen"], elem_classes=["pixelated"],
                      elem_id=f"{tab}-gallery")
