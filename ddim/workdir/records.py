"""JSON-lines record files: ``eval.jsonl`` and the benchmarks' results, one JSON object per line.

Records are only ever appended, one line at a time, so a file is read whole and a line that does not parse
as a JSON object (the tail of an append cut short by a kill) is skipped rather than failing every later read.
"""

from __future__ import annotations

import json
import os
from typing import Any


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line to ``path`` (created if missing)."""
    with open(path, "a", encoding="utf-8") as file:
        file.write(json.dumps(record, sort_keys=False) + "\n")


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record in ``path``, oldest first; none when the file does not exist.

    Lines that are blank or not a JSON object are skipped; other read errors (permissions, a directory)
    propagate as ``OSError``.
    """
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
