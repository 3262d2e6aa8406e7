"""The evaluation job (``ddim eval``): KID and FID of a checkpoint's samples, appended to ``eval.jsonl``.

The protocol (see docs/evaluation.md): FID from the standard FID
Inception (the 2015-12-05 TF graph's pool3 features at 299x299,
:mod:`ddim.evaluation.fid_inception`), so it can be set beside papers' FIDs;
KID from the same features by default, or from Keras' InceptionV3 at 75x75
(``kid_net="keras"``: the Keras example's KID). Keras' network can also give
the FID (``fid_net="keras"``, the earlier protocol). Generated images come from
the checkpoint's EMA weights (:mod:`ddim.evaluation.generated`); real images
and their cached features and statistics from
:mod:`ddim.evaluation.reference`, or the reference statistics from a file
(``real_stats``, pytorch-fid's ``mu``/``sigma`` format). What to do is one
:class:`~ddim.evaluation.request.EvalRequest`; each run appends one JSON line
to ``<workdir>/eval.jsonl`` (:mod:`ddim.evaluation.record`). A class-conditional
checkpoint's line adds its guidance scale, class mode and class accuracy
(:mod:`ddim.evaluation.conditional`). Every line names the kernels that ran the network's convolutions
(``conv_kernels``: ``onednn`` or ``xla``, with ``conv_kernels_reason``).

The network never runs with random weights unless a caller injects its own
``feature_extractor_factory`` (the tests do; the CLI never does).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ddim.evaluation import class_consistency, metrics
from ddim.evaluation.conditional import (
    ClassPlan, RealClasses, as_model_ids, data_class_names, fit_on_real, of_one_class, plan_classes, record_fields,
)
from ddim.evaluation.features import FID_IMAGE_SIZE, KID_IMAGE_SIZE, EvaluationError, FeatureExtractor, FeatureFactory
from ddim.evaluation.generated import generated_features
from ddim.evaluation.keras_inception import file_md5, inception_factory
from ddim.evaluation.record import format_table  # noqa: F401  (re-exported)
from ddim.evaluation.reference import labelled_real_features, load_real_stats, real_features, split_expression
from ddim.evaluation.request import NETWORKS, EvalRequest  # noqa: F401  (NETWORKS: re-exported)
from ddim.workdir.layout import EVAL_FILE, Workdir
from ddim.workdir.records import append_record

Log = Callable[[str], None]


def _log_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def workdir_of(checkpoint_path: str | os.PathLike) -> Path:
    """The work directory of a checkpoint step directory ``<workdir>/checkpoints/<step>``.

    A step directory outside ``checkpoints/`` (or ``best/``) belongs to the folder that holds it.
    """
    return Workdir.of_checkpoint(Path(checkpoint_path).absolute().parent).root


@dataclass(frozen=True)
class _Checkpoint:
    """The loaded pipeline, the work directory the results go to, and the config that names the real images."""

    pipe: Any
    workdir: Workdir
    config: Any
    classes: ClassPlan | None
    """What a class-conditional checkpoint is asked for (None: an unconditional one)."""


@dataclass(frozen=True)
class _Real:
    """The real side: KID features (None: no KID) and FID features, or the reference statistics instead."""

    kid_extractor: FeatureExtractor | None
    kid_features: np.ndarray | None
    fid_features: np.ndarray | None
    stats: dict[str, Any] | None
    record: dict[str, Any]


def evaluate(
    request: EvalRequest,
    *,
    feature_extractor_factory: FeatureFactory | None = None,
    log: Log | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run ``request``: the record appended to ``eval.jsonl``, returned with ``eval_file`` added.

    The weights are resolved before anything else. With ``real_stats`` KID is
    computed only when the file also holds the features of ``kid_net`` (ddim's
    cache files do). ``feature_extractor_factory(image_size)`` replaces both
    networks (tests only).
    """
    started = time.perf_counter()
    log = log or _log_stderr
    reference_stats = load_real_stats(request.real_stats) if request.real_stats is not None else None
    factories = _feature_factories(request, feature_extractor_factory, log)
    checkpoint, request = _load_checkpoint(request, log)
    fid_extractor, kid_extractor = _networks(request, factories)
    # The classifier's real side first: with split "all", FID's reference then joins its cached train and val features.
    real_classes = _real_classes(checkpoint, fid_extractor, log, show_progress)
    if reference_stats is None:
        real = _real_images(request, checkpoint, fid_extractor, kid_extractor, log, show_progress)
    else:
        real = _real_statistics(request, reference_stats, fid_extractor, kid_extractor, log)
    generated = _generated(request, checkpoint, real, real_classes, fid_extractor, log, show_progress)
    scores = _scores(request, real, generated.kid_features, generated.fid_stats)
    record = _record(request, checkpoint.pipe, real, scores, fid_extractor, time.perf_counter() - started)
    if checkpoint.classes is not None:
        record.update(record_fields(checkpoint.classes, real_classes, generated.predicted, generated.asked))
    return _append(checkpoint.workdir, record)


def evaluate_checkpoint(
    source: str | os.PathLike,
    *,
    feature_extractor_factory: FeatureFactory | None = None,
    log: Log | None = None,
    show_progress: bool = True,
    **settings: Any,
) -> dict[str, Any]:
    """:func:`evaluate` of ``EvalRequest.of(source, **settings)``: the loose keywords callers always used
    (``num=``, ``steps=``, ``sampler=``, ``weights=``, ...; see :meth:`EvalRequest.of`)."""
    request = EvalRequest.of(source, **settings)
    return evaluate(request, feature_extractor_factory=feature_extractor_factory, log=log, show_progress=show_progress)


def _feature_factories(request: EvalRequest, injected: FeatureFactory | None, log: Log) -> dict[str, FeatureFactory]:
    """One factory per network named; resolving their weights now fails before any slow work."""
    factories: dict[str, FeatureFactory] = {}
    for net in request.networks:
        if injected is not None:
            factories[net] = injected
        elif net == "standard":
            from ddim.evaluation.fid_inception import standard_factory  # JAX: only when the network is wanted

            factories[net] = standard_factory(request.fid_weights, request.feature_batch_size, log=log)
        else:
            factories[net] = inception_factory(request.inception_weights, request.feature_batch_size, log=log)
    return factories


def _load_checkpoint(request: EvalRequest, log: Log) -> tuple[_Checkpoint, EvalRequest]:
    """The checkpoint's pipeline and its (writable) work directory, the real images' config; and ``request`` with
    its spec resolved against the model."""
    import jax

    from ddim.sampling import load

    pipe = load(request.source)
    spec = pipe.rules.resolve(request.spec, **dict(request.spec_changes))
    request = dataclasses.replace(request, spec=spec, spec_changes=())
    classes = plan_classes(pipe, request.only_class, request.spec)  # refuses classes an unconditional model lacks
    workdir = Workdir(request.workdir) if request.workdir is not None else Workdir(workdir_of(pipe.path))
    _prepare_workdir(workdir)
    config = pipe.config
    if request.image_dir is not None:
        data = dataclasses.replace(config.data, image_dir=str(request.image_dir))
        config = dataclasses.replace(config, data=data)
    log(
        f"checkpoint {pipe.path} (step {pipe.step}, config {pipe.config.name}); "
        f"{jax.device_count()} {jax.default_backend()} device(s)"
    )
    if classes is not None:
        log(f"classes: {classes.mode}, guidance {classes.guidance:g} ({len(classes.names)} classes)")
    return _Checkpoint(pipe, workdir, config, classes), request


def _prepare_workdir(workdir: Workdir) -> None:
    cache_dir = workdir.eval_cache
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EvaluationError(f"cannot create {cache_dir}: {error.strerror or error}") from None
    if not os.access(workdir.root, os.W_OK) or not os.access(cache_dir, os.W_OK):
        raise EvaluationError(
            f"work directory {workdir.root} is not writable (eval writes {EVAL_FILE} and {cache_dir.name}/)"
        )


def _networks(request: EvalRequest, factories: dict[str, FeatureFactory]):
    """The FID and the KID extractor (the same object when one network gives both at one size)."""
    built: dict[tuple[str, int], FeatureExtractor] = {}

    def network(net: str, image_size: int) -> FeatureExtractor:
        if (net, image_size) not in built:
            built[(net, image_size)] = factories[net](image_size)
        return built[(net, image_size)]

    fid_extractor = network(request.fid_net, FID_IMAGE_SIZE)
    kid_extractor = network(request.kid_net, KID_IMAGE_SIZE if request.kid_net == "keras" else FID_IMAGE_SIZE)
    return fid_extractor, kid_extractor


def _real_classes(checkpoint: _Checkpoint, fid_extractor, log: Log, show_progress: bool) -> RealClasses | None:
    """The class classifier on the FID features of the checkpoint's own labelled data (not ``--data``'s)."""
    if checkpoint.classes is None:
        return None
    from ddim import data as data_lib

    config, workdir = checkpoint.pipe.config, checkpoint.workdir
    return fit_on_real(checkpoint.classes, config, fid_extractor, workdir.eval_cache, log, show_progress,
                       data_lib.cache_root(config, workdir.root))


def _real_images(request: EvalRequest, checkpoint: _Checkpoint, fid_extractor, kid_extractor, log: Log,
                 show_progress: bool) -> _Real:
    """Features of the real ``split`` images (of the one class asked for), from the work directory's cache when
    possible."""
    from ddim import data as data_lib

    config, workdir = checkpoint.config, checkpoint.workdir
    arguments = (config, request.split, request.real_num, [kid_extractor, fid_extractor], workdir.eval_cache, log,
                 show_progress)
    data_cache = data_lib.cache_root(config, workdir.root)
    if checkpoint.classes is not None and checkpoint.classes.class_id is not None:
        features, labels = labelled_real_features(*arguments, data_cache=data_cache)
        labels = as_model_ids(checkpoint.classes, labels, data_class_names(config, data_cache))
        real_kid, real_fid = of_one_class(checkpoint.classes, features, labels, request.split)
    else:
        real_kid, real_fid = real_features(*arguments, data_cache=data_cache)
    expression = split_expression(config, request.split)
    record = {"real_num": int(len(real_fid)), "split": request.split, "split_expression": expression}
    return _Real(kid_extractor, real_kid, real_fid, None, record)


def _real_statistics(request: EvalRequest, stats: dict[str, Any], fid_extractor, kid_extractor, log: Log) -> _Real:
    """The reference statistics file in place of the real images; KID only if it holds the KID network's features."""
    path = request.real_stats
    if stats["network"] not in (None, fid_extractor.identity):
        raise EvaluationError(f"{path} was computed with {stats['network']}, not {fid_extractor.identity}")
    real_kid = stats["features"] if kid_extractor is fid_extractor else None
    if real_kid is None:
        kid_extractor = None
        log(f"KID: not computed ({path} holds no {request.kid_net} features; --real-stats alone gives FID)")
    record = {
        "real_num": int(len(real_kid)) if real_kid is not None else None,
        "real_stats": str(path),
        "real_stats_md5": file_md5(path),
    }
    return _Real(kid_extractor, real_kid, None, stats, record)


@dataclass(frozen=True)
class _Generated:
    """What is kept of the generated images: KID features, FID statistics, and their asked and predicted classes."""

    kid_features: np.ndarray | None
    fid_stats: tuple[np.ndarray, np.ndarray]
    asked: np.ndarray | None
    predicted: np.ndarray | None


def _generated(request: EvalRequest, checkpoint: _Checkpoint, real: _Real, real_classes: RealClasses | None,
               fid_extractor, log: Log, show_progress: bool) -> _Generated:
    """KID features, FID statistics (and classes) of ``request.num`` generated images, batch by batch."""
    from ddim.summary import Progress

    pipe, plan = checkpoint.pipe, checkpoint.classes
    progress = Progress(request.num, 0, description="eval") if show_progress else None
    started = time.perf_counter()
    asked: list[np.ndarray] = []
    predicted: list[np.ndarray] = []

    def generate(count: int, seed: int) -> np.ndarray:
        if plan is None:
            return pipe.generate(count, spec=request.spec, seed=seed, batch_size=count)
        asked.append(plan.asked(pipe, count, seed))  # the classes generate() draws from this seed
        return pipe.generate(count, spec=request.spec, seed=seed, batch_size=count, classes=asked[-1])

    def classify(features: np.ndarray) -> None:
        predicted.append(class_consistency.predict(real_classes.classifier, features))

    def on_batch(done: int) -> None:
        if progress is not None:
            progress.update(done, "")

    # With reference statistics the generated FID features are kept too: FID then needs no d x d
    # eigendecomposition when there are fewer images than dimensions.
    keep = real.kid_extractor if real.kid_extractor is not None or real.stats is None else fid_extractor
    try:
        kid_features, fid_stats = generated_features(
            generate, request.num, request.batch_size, request.seed, keep, fid_extractor, on_batch,
            classify if real_classes is not None else None,
        )
    finally:
        if progress is not None:
            progress.close()
    log(f"generated and featurised {request.num} images in {time.perf_counter() - started:.1f}s")
    if plan is None:
        return _Generated(kid_features, fid_stats, None, None)
    return _Generated(kid_features, fid_stats, np.concatenate(asked), np.concatenate(predicted))


def _scores(request: EvalRequest, real: _Real, gen_features, gen_stats) -> dict[str, Any]:
    """KID (mean, std, subset size; None without KID features) and FID."""
    kid_mean = kid_std = subset_size = None
    if real.kid_extractor is not None:
        subset_size = min(request.kid_subset_size, len(real.kid_features), len(gen_features))
        kid_mean, kid_std = metrics.kid(
            real.kid_features, gen_features, request.kid_subsets, subset_size, rng=request.seed % 2**32
        )
    if real.stats is None:
        fid = metrics.fid_from_features_and_stats(real.fid_features, *gen_stats)
    else:
        if real.stats["mu"].shape != gen_stats[0].shape:
            raise EvaluationError(
                f"{request.real_stats} holds {real.stats['mu'].size}-d statistics, but the {request.fid_net} "
                f"network gives {gen_stats[0].size}-d features"
            )
        fid = metrics.fid_from_features_and_stats(gen_features, real.stats["mu"], real.stats["sigma"])
    return {"kid_mean": kid_mean, "kid_std": kid_std, "kid_subset_size": subset_size, "fid": fid}


def _record(request: EvalRequest, pipe, real: _Real, scores: dict[str, Any], fid_extractor,
            wall_time: float) -> dict[str, Any]:
    """The ``eval.jsonl`` line: what was scored and how, then the scores and the networks behind them."""
    kid_extractor = real.kid_extractor
    return {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": str(pipe.path),
        "step": pipe.step,
        "config": pipe.config.name,
        **request.spec.to_dict(),
        "seed": request.seed,
        "num": request.num,
        "batch_size": request.batch_size,  # the batches draw the noise and the classes: part of what was sampled
        **real.record,
        "kid_mean": scores["kid_mean"],
        "kid_std": scores["kid_std"],
        "kid_subsets": request.kid_subsets if kid_extractor is not None else None,
        "kid_subset_size": scores["kid_subset_size"],
        "kid_image_size": kid_extractor.image_size if kid_extractor is not None else None,
        "fid": scores["fid"],
        "fid_image_size": fid_extractor.image_size,
        "kid_net": request.kid_net,
        "fid_net": request.fid_net,
        "kid_feature_net": kid_extractor.identity if kid_extractor is not None else None,
        "fid_feature_net": fid_extractor.identity,
        "fid_weights_sha256": getattr(fid_extractor, "digest", None),
        **_conv_kernels(pipe),
        "wall_time_s": round(wall_time, 3),
    }


def _conv_kernels(pipe) -> dict[str, Any]:
    """Which kernels ran the sampled network's convolutions (``conv_kernels``, and why XLA's: ddim/onednn.py)."""
    import jax

    from ddim import onednn

    return onednn.kernels(jax.default_backend(), pipe.config.model.dtype)


def _append(workdir: Workdir, record: dict[str, Any]) -> dict[str, Any]:
    eval_file = workdir.eval_file
    try:
        append_record(eval_file, record)
    except OSError as error:
        raise EvaluationError(f"cannot write {eval_file}: {error.strerror or error}") from None
    return {**record, "eval_file": str(eval_file)}
