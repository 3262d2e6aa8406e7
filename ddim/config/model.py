"""``[model]``: the network and the noise schedule, everything needed to rebuild the model."""

from __future__ import annotations

from dataclasses import dataclass

from ddim.config.parsing import ConfigError, at_least, choice

PREDICTIONS = ("noise", "velocity", "image")
"""What a network can predict (:class:`ddim.objective.Objective` turns each into noise and image)."""


@dataclass(frozen=True)
class ModelConfig:
    """The network and the noise schedule (everything needed to rebuild the model)."""

    image_size: int = 64
    """Side of the square training and generated images, in pixels."""
    channels: int = 3
    """Image channels (3 for RGB)."""
    widths: tuple[int, ...] = (32, 64, 96, 128)
    """Channel width of each UNet level; every level but the last halves the resolution."""
    block_depth: int = 2
    """Residual blocks per UNet level (down and up)."""
    embedding_dims: int = 32
    """Size of the sinusoidal embedding of the noise variance (must be even)."""
    embedding_min_frequency: float = 1.0
    """Lowest frequency of the sinusoidal embedding."""
    embedding_max_frequency: float = 1000.0
    """Highest frequency of the sinusoidal embedding."""
    min_signal_rate: float = 0.02
    """Signal rate at diffusion time 1 (the noisiest level of the cosine schedule)."""
    max_signal_rate: float = 0.95
    """Signal rate at diffusion time 0 (the cleanest level of the cosine schedule)."""
    dtype: str = "float32"
    """Compute dtype of the network: "float32" or "bfloat16" (parameters and loss stay float32).

    bfloat16 is for GPUs/TPUs; on CPUs XLA's bfloat16 convolutions are slower than float32."""
    prediction: str = "noise"
    """What the network predicts: "noise" (eps, the Keras example), "velocity" (v = alpha eps - sigma x_0,
    Salimans & Ho 2022) or "image" (x_0; distilled students). Samplers and tools convert each to (noise, image)
    (ddim/objective.py)."""
    attention_resolutions: tuple[int, ...] = ()
    """Feature-map sides (pixels) whose residual blocks are followed by multi-head self-attention, e.g. [8, 16]
    (DDPM puts it at 16x16; ADM at 32, 16, 8). Empty: no attention (the Keras example)."""
    attention_heads: int = 1
    """Heads of each self-attention layer (ADM Table 1: more heads help); must divide the level's width."""
    dropout: float = 0.0
    """Dropout rate inside each residual block, before its second convolution (DDPM uses 0.1 on CIFAR-10)."""
    embedding_injection: str = "input"
    """How the noise embedding reaches the network: "input" (concatenated to the input, the Keras example) or
    "every-block" (also a per-block scale and shift of the normalised features, ADM's AdaGN)."""
    class_conditional: bool = False
    """Condition the network on each image's class, for class-conditional sampling with classifier-free guidance
    (Ho & Salimans 2022): the classes come from the data (TFDS labels, or an image folder's subfolders)."""
    class_embedding: str = "noise-features"
    """How the class reaches a class-conditional network: "noise-features" (a learned vector, initialised small,
    std 0.1 for 102 classes, added to the noise level's sinusoidal features before the input and the block
    embedding's MLP) or "adm" (ADM's label_emb, Dhariwal & Nichol 2021: a unit-normal vector per class added to
    the block embedding after its MLP; needs embedding_injection "every-block"). The small vectors of
    "noise-features" stay small in training, and the network hardly uses them (benchmarks.studies.class_usage)."""
    num_classes: int = 0
    """Classes of the training data; set from the data when training starts (0: unconditional)."""
    class_names: tuple[str, ...] = ()
    """The classes' names, set from the data (TFDS label names, or subfolder names)."""
    class_counts: tuple[int, ...] = ()
    """Training images per class, set from the data: classes are drawn with these frequencies when none is asked."""
    guidance_input: bool = False
    """The network takes the classifier-free guidance scale as an input and gives the guided prediction in one pass
    (Meng et al. 2023, "On distillation of guided diffusion models"): set by ``ddim distill`` on the student of a
    class-conditional teacher, never trained from scratch."""
    guidance_range: tuple[float, ...] = ()
    """With guidance_input: the [lowest, highest] guidance scale the student was distilled on; others are refused."""
    distilled_steps: int = 0
    """0 for a diffusion model (any step count, any sampler). A distilled student (``ddim distill``) samples by
    default with this many steps of its distilled_sampler on the uniform grid, and with no count outside
    distilled_step_counts."""
    distilled_sampler: str = "ddim"
    """A distilled student's sampler: "ddim" (deterministic DDIM steps, a progressive student) or "consistency"
    (multistep consistency sampling, a consistency student: denoise, re-noise to the next time, denoise)."""
    distilled_step_counts: tuple[int, ...] = ()
    """The step counts a distilled student samples with; empty: distilled_steps alone (a progressive student).
    A consistency student lists every count it was distilled for (e.g. [1, 2, 4])."""
    distilled_from: str = ""
    """A distilled student's teacher as ``ddim distill`` was given it (``pretrained:NAME`` or its path): the
    diffusion model that does what a student cannot (invert, reconstruct, edit)."""



    @property
    def takes_classes(self) -> bool:
        """Whether sampling takes classes: a class-conditional network with classes (a class-conditional model
        fine-tuned on images without classes has only its null class, and samples as an unconditional one)."""
        return self.class_conditional and self.num_classes > 0


def validate_model(m: ModelConfig) -> None:
    """Check the relations between ``[model]`` values that types alone cannot express."""
    levels = len(m.widths) - 1
    if not m.widths or any(w < 1 for w in m.widths):
        raise ConfigError("model.widths must be a non-empty list of positive integers")
    if m.image_size < 1 or m.image_size % (2**levels):
        raise ConfigError(f"model.image_size ({m.image_size}) must be a positive multiple of 2**{levels}")
    if m.embedding_dims < 2 or m.embedding_dims % 2:
        raise ConfigError(f"model.embedding_dims must be even and >= 2, got {m.embedding_dims}")
    if not 0.0 < m.min_signal_rate < m.max_signal_rate < 1.0:
        raise ConfigError("need 0 < model.min_signal_rate < model.max_signal_rate < 1")
    if m.dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"model.dtype must be 'float32' or 'bfloat16', got {m.dtype!r}")
    at_least(1, {"model.block_depth": m.block_depth, "model.channels": m.channels})
    choice("model.prediction", m.prediction, PREDICTIONS)
    choice("model.embedding_injection", m.embedding_injection, ("input", "every-block"))
    choice("model.class_embedding", m.class_embedding, ("noise-features", "adm"))
    if m.class_conditional and m.class_embedding == "adm" and m.embedding_injection != "every-block":
        # An unconditional model has no class embedding: a config may name "adm" for when it trains by class.
        raise ConfigError('model.class_embedding "adm" adds the class to the block embedding, which only '
                          'model.embedding_injection "every-block" has: add --set model.embedding_injection=every-block '
                          'to train by class')
    sides = {m.image_size // 2**level: m.widths[level] for level in range(len(m.widths))}
    for side in m.attention_resolutions:
        if side not in sides:
            raise ConfigError(f"model.attention_resolutions: no UNet level is {side}x{side} "
                              f"(the levels are {', '.join(str(s) for s in sides)})")
        if m.attention_heads < 1 or sides[side] % m.attention_heads:
            raise ConfigError(f"model.attention_heads ({m.attention_heads}) must divide the width {sides[side]} "
                              f"of the {side}x{side} level")
    if m.num_classes < 0 or len(m.class_names) not in (0, m.num_classes) or len(m.class_counts) not in (0, m.num_classes):
        raise ConfigError("model.class_names and model.class_counts must have model.num_classes entries")
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError(f"model.dropout must be in [0, 1), got {m.dropout}")
    if m.distilled_steps < 0:
        raise ConfigError(f"model.distilled_steps must be >= 0, got {m.distilled_steps}")
    choice("model.distilled_sampler", m.distilled_sampler, ("ddim", "consistency"))
    if m.distilled_step_counts and (m.distilled_steps not in m.distilled_step_counts
                                    or any(count < 1 for count in m.distilled_step_counts)):
        raise ConfigError(f"model.distilled_step_counts ({list(m.distilled_step_counts)}) must be positive and hold "
                          f"model.distilled_steps ({m.distilled_steps})")
    if m.guidance_input and not m.class_conditional:
        raise ConfigError("model.guidance_input needs a class-conditional model (guidance needs classes)")
    if m.guidance_range and (len(m.guidance_range) != 2 or not 0.0 <= m.guidance_range[0] <= m.guidance_range[1]):
        raise ConfigError(f"model.guidance_range must be [lowest, highest] with 0 <= lowest <= highest, "
                          f"got {list(m.guidance_range)}")
