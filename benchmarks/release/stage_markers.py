"""Where a rebuild keeps its state in ``--out``: a marker per stage and the rebuild's identity, both JSON.

``<out>/stages/STAGE.json`` records a stage's commands done so far, its seconds, the device and hardware it ran
on and, once ``complete``, a ``choose`` or ``record`` step's result; it is written after each command succeeds,
through a temporary file, so a stopped rebuild resumes at the first command not done. ``<out>/rebuild.json``
names the recipe, ``--smoke`` and the ``--set`` settings, so that one directory holds one rebuild.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from benchmarks.release.recipe_files import Recipe, RebuildError

STAGES = "stages"
STATE = "rebuild.json"


def marker_path(out: Path, stage: str) -> Path:
    return out / STAGES / f"{stage}.json"


def read_marker(out: Path, stage: str) -> dict[str, Any] | None:
    try:
        return json.loads(marker_path(out, stage).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise RebuildError(f"cannot read {marker_path(out, stage)}: {error}") from None


def write_atomically(path: Path, values: dict[str, Any]) -> None:
    """Write ``values`` as JSON to ``path`` through a temporary file renamed into place: all or nothing."""
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging.write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")
        os.replace(staging, path)
    except OSError as error:
        raise RebuildError(f"cannot write {path}: {error.strerror or error}") from None


def prepare_out(out: Path, recipe: Recipe, smoke: bool, overrides: dict[str, str]) -> None:
    """Create ``out`` (or check it), and refuse one that holds a rebuild of another recipe or settings."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test.{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise RebuildError(f"cannot write to --out {out}: {error.strerror or error}") from None
    wanted = {"recipe": recipe.name, "smoke": smoke, "settings": overrides}
    path = out / STATE
    if not path.is_file():
        write_atomically(path, wanted)
        return
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise RebuildError(f"cannot read {path}: {error}") from None
    if found != wanted:
        raise RebuildError(f"{out} holds a rebuild of {found.get('recipe')} "
                           f"({'smoke, ' if found.get('smoke') else ''}settings {found.get('settings')}), not "
                           f"this one; use another --out")


def duration(seconds: float) -> str:
    """``4.2 s``, ``5 min 26 s``, ``1 h 59 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
