"""The result of an evaluation as a small table (the ``eval.jsonl`` line is appended by :mod:`ddim.workdir.records`)."""

from __future__ import annotations

from typing import Any


_NETWORK_LABELS = {"standard": "pool3", "keras": "Keras"}


def format_table(result: dict[str, Any]) -> str:
    """A small two-column text table of an evaluation result."""
    def net(kind: str) -> str:
        return _NETWORK_LABELS.get(result.get(f"{kind}_net") or "", result.get(f"{kind}_net") or "?")

    if result.get("real_stats"):
        real = f"statistics from {result['real_stats']}"
    else:
        real = f"{result['real_num']} images of the {result['split']} split ({result['split_expression']})"
    if result.get("kid_mean") is None:
        kid = ("KID", "not computed (the reference statistics file holds no features)")
    else:
        kid = (
            f"KID ({net('kid')}, {result['kid_image_size']}px)",
            f"{result['kid_mean']:.4g} ± {result['kid_std']:.2g} "
            f"({result['kid_subsets']} subsets of {result['kid_subset_size']})",
        )
    rows = [
        ("checkpoint", f"{result['checkpoint']} (step {result['step']})"),
        (
            "generated",
            f"{result['num']} images, {result['steps']} steps of {result.get('sampler', 'ddim')} "
            f"({result.get('spacing', 'uniform')} spacing), eta {result['eta']:g}, seed {result['seed']}",
        ),
        ("real", real),
        kid,
        (f"FID ({net('fid')}, {result['fid_image_size']}px)", f"{result['fid']:.2f}"),
        *_class_rows(result),
        ("FID network", result["fid_feature_net"]),
        ("wall time", f"{result['wall_time_s']:.1f}s"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _class_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """A conditional checkpoint's rows: its classes and guidance, and the class accuracy beside its ceiling."""
    if "class_mode" not in result:
        return []
    ceiling = result.get("real_val_class_accuracy")
    accuracy = (f"{_percent(result['class_accuracy'])} of the generated images; real val images "
                f"{_percent(ceiling)} (the ceiling); chance {_percent(result['chance'])}")
    return [("classes", f"{result['class_mode']}, guidance {result['guidance']:g}"), ("class accuracy", accuracy)]


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"
