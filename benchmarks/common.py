"""What the quality benchmarks share: logging and the checkpoint to measure."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resolve_checkpoint(checkpoint: str | None, out: Path) -> Path:
    """The checkpoint to measure; trains the smoke config into ``out/smoke-run`` when none is given."""
    if checkpoint:
        return Path(checkpoint)
    from ddim.config import load_config
    from ddim.train import train

    workdir = out / "smoke-run"
    log(f"no --checkpoint: training configs/smoke.toml into {workdir} (a tiny model; numbers are illustrative)")
    train(load_config(REPO / "configs" / "smoke.toml"), workdir, log=lambda message: None)
    return workdir
