"""Training output: TensorBoard summaries, progress display, and the reports of periodic actions.

TensorBoard event files are written with ``tf.summary`` (TensorFlow is already
the input pipeline's dependency; it is imported only when a writer is made).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np


class SummaryWriter:
    """Scalars and images for TensorBoard, in ``logdir``."""

    def __init__(self, logdir: str | Path):
        from ddim.lazy_tensorflow import tensorflow

        self._tf = tensorflow()
        self._writer = self._tf.summary.create_file_writer(str(logdir))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        with self._writer.as_default(step=step):
            for name, value in values.items():
                self._tf.summary.scalar(name, float(value))

    def image(self, step: int, name: str, image: np.ndarray) -> None:
        """One ``(H, W, C)`` uint8 image."""
        with self._writer.as_default(step=step):
            self._tf.summary.image(name, np.asarray(image)[None], max_outputs=1)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def summary_writer(logdir: str | Path, say: Callable[[str], None]) -> SummaryWriter | None:
    """TensorBoard's writer in ``logdir``, or None with a warning through ``say`` when TensorFlow (which writes
    the events) is missing."""
    try:
        return SummaryWriter(logdir)
    except ImportError as error:
        say(f"warning: no TensorBoard summaries ({error}); install tensorflow-cpu for them")
        return None


def say_stderr(message: str) -> None:
    """A log line on stderr, before a run has its progress display."""
    print(message, file=sys.stderr, flush=True)


def plural(count: int, noun: str) -> str:
    """``1 step``, ``2 steps``; ``noun`` may go on after the word (``"step/epoch"``: ``3 steps/epoch``)."""
    word, slash, rest = noun.partition("/")
    return f"{count} {word}{'' if count == 1 else 's'}{slash}{rest}"


def format_duration(seconds: float) -> str:
    """``35 s``, ``12 min``, ``1 h 24 min``: a duration as a log line says it."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def format_metrics(values: Mapping[str, float]) -> str:
    return " ".join(f"{name}={value:.4g}" for name, value in values.items())


class Progress:
    """A progress bar on a terminal, plain log lines otherwise (CI logs, files).

    Both show the step, the latest metrics and the throughput in images/s.
    """

    def __init__(self, total_steps: int, start_step: int, description: str = "train", stream=None):
        self.stream = stream or sys.stderr
        self._bar = None
        if self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
            from rich.progress import TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"),
                console=Console(file=self.stream),
            )
            self._task = self._bar.add_task(description, total=total_steps, completed=start_step, status="")
            self._bar.start()

    @property
    def interactive(self) -> bool:
        return self._bar is not None

    def update(self, step: int, status: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=status)

    def log(self, message: str) -> None:
        if self._bar is not None:
            self._bar.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@dataclass
class Report:
    """What a periodic action of the training loop has to say: scalars, images, a log line."""

    scalars: dict[str, float] = field(default_factory=dict)
    """TensorBoard scalars by full name (``"val/noise_loss"``)."""
    images: dict[str, np.ndarray] = field(default_factory=dict)
    """TensorBoard images by name, each ``(H, W, C)`` uint8."""
    message: str | None = None
    """One line for the log, or None."""


class Reporter:
    """Writes :class:`Report` objects: scalars and images to TensorBoard, messages to the log.

    Only the writing process (process 0) has a TensorBoard writer; the others
    write nothing, but every process takes part in computing what is reported.
    """

    def __init__(self, writer: SummaryWriter | None, say: Callable[[str], None]):
        self.writer = writer
        self.say = say

    def write(self, step: int, report: Report | None) -> None:
        if report is None:
            return
        if self.writer is not None:
            if report.scalars:
                self.writer.scalars(step, report.scalars)
            for name, image in report.images.items():
                self.writer.image(step, name, image)
            if report.images:
                self.writer.flush()
        if report.message:
            self.say(report.message)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
