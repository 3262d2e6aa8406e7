"""What the benchmarks share: logging, the ``ddim`` command, a free port, JSON results, the model to measure, and
FID as ``ddim eval --split all`` scores it."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ddim_command(*args: str) -> list[str]:
    """``ddim ARGS`` as a child process of this interpreter (the ``ddim`` on the PATH may be another install's)."""
    return [sys.executable, "-m", "ddim.cli", *args]


def free_port() -> int:
    """A TCP port of localhost that no one listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def print_json(result, out: str | os.PathLike | None = None) -> None:
    """Print ``result`` as indented JSON, and write the same text to ``out`` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint PATH`` or ``--pretrained NAME`` (neither: train the smoke config)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--checkpoint", help="work dir, checkpoints dir or step dir (default: train the smoke config)")
    group.add_argument("--pretrained", metavar="NAME", help="a model bundled with ddim (`ddim pretrained` lists them)")


def model_source(args: argparse.Namespace, out: Path) -> Path | str:
    """What ``ddim.load`` takes for :func:`add_model_options`' options: ``"pretrained:NAME"`` or a checkpoint."""
    if args.pretrained is None:
        return resolve_checkpoint(args.checkpoint, out)
    from ddim.pretrained import PretrainedError
    from ddim.pretrained.registry import find, source_of

    try:
        return source_of(find(args.pretrained).name)
    except PretrainedError as error:
        raise SystemExit(f"error: {error}") from None


def resolve_checkpoint(checkpoint: str | None, out: Path) -> Path:
    """The checkpoint to measure; trains the smoke config into ``out/smoke-run`` when none is given."""
    if checkpoint:
        return Path(checkpoint)
    from ddim.config import load_config
    from ddim.train import train

    workdir = out / "smoke-run"
    log(f"no --checkpoint: training ddim/configs/smoke.toml into {workdir} (a tiny model; numbers are illustrative)")
    train(load_config("smoke"), workdir, log=lambda message: None)
    return workdir


def fid_request(source, spec, num: int, eval_root: Path, *, seed: int = 0, batch_size: int = 64):
    """The ``ddim eval`` request of the docs' protocol: all real images, the standard FID Inception, KID on all
    ``num`` samples at once, results in ``eval_root``."""
    from ddim.evaluation import EvalRequest

    return EvalRequest(source, num=num, spec=spec, seed=seed, batch_size=batch_size, split="all",
                       workdir=eval_root, kid_subset_size=num)


def earlier_record(source, spec, num: int, eval_root: Path, *, seed: int = 0, batch_size: int = 64) -> dict | None:
    """The ``<eval_root>/eval.jsonl`` record of this very measurement (:func:`fid_request`), if one is there.

    A record matches when it scored the same checkpoint path (a step directory, as ``curve`` passes; a work
    directory or bundled name never matches, since its step is only known once loaded) with the request's
    sampling (no guidance is 1, plain conditional sampling), seed, number of samples, batch size (the batches
    draw the noise and the classes), split, networks and KID subset size, classes drawn as the data has them.
    Records written before the batch size was recorded never match. So benchmarks that share an eval root
    (``curve``'s checkpoint at step N and ``guidance``'s guidance 1 of it) pay for a measurement once.
    """
    from ddim.spec import guidance_scale
    from ddim.workdir import Workdir
    from ddim.workdir.records import read_records

    request = fid_request(source, spec, num, eval_root, seed=seed, batch_size=batch_size)
    wanted = {**request.spec.to_dict(), "guidance": guidance_scale(spec.guidance),
              "checkpoint": str(request.source), "seed": request.seed, "num": request.num,
              "batch_size": request.batch_size, "split": request.split, "fid_net": request.fid_net,
              "kid_net": request.kid_net, "kid_subset_size": request.kid_subset_size}
    found = None
    for record in read_records(Workdir(eval_root).eval_file):
        if (all(record.get(key) == value for key, value in wanted.items() if key != "guidance")
                and guidance_scale(record.get("guidance")) == wanted["guidance"]
                and record.get("clip", False) == request.spec.clip
                and record.get("class_mode") in (None, "data-frequency", "unconditional")):
            found = record  # the newest wins
    return found


def score_fid(source, spec, num: int, eval_root: Path, *, seed: int = 0, batch_size: int = 64,
              feature_extractor_factory=None) -> dict:
    """``ddim eval``'s record of ``num`` samples of ``source`` (``spec``) against all real images at the model's size.

    The docs' protocol (:func:`fid_request`). The real features are cached in ``<eval_root>/eval_cache``
    (computed once, reused by every call) and the record is appended to ``<eval_root>/eval.jsonl``; a
    measurement already recorded there (:func:`earlier_record`) is not repeated.
    """
    from ddim.evaluation import evaluate

    record = earlier_record(source, spec, num, eval_root, seed=seed, batch_size=batch_size)
    if record is not None:
        log(f"{source}: reusing the record of {record['time']} in {eval_root} (FID {record['fid']:.2f})")
        return record
    request = fid_request(source, spec, num, eval_root, seed=seed, batch_size=batch_size)
    return evaluate(request, feature_extractor_factory=feature_extractor_factory, log=log, show_progress=False)
