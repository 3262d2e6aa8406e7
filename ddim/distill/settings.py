"""A distillation run's settings, checked before anything is trained: its config (the teacher's, with the
``[distill]`` section and the overrides), how it names its teacher, and the work directory's record of that
teacher."""

from __future__ import annotations

from pathlib import Path

from ddim.config import Config, ConfigError, apply_overrides, from_dict
from ddim.config import named as named_config
from ddim.train.actions import TrainingError
from ddim.workdir import Workdir
from ddim.workdir.records import append_record, read_records


def teacher_identity(source: str | Path) -> str:
    """How ``distill.jsonl`` and the students' configs name a teacher: ``pretrained:NAME``, or the absolute path."""
    from ddim.pretrained.registry import pretrained_name

    return str(source) if pretrained_name(source) is not None else str(Path(source).absolute())


def run_config(teacher: Config, config_file: str | Path | None = None, overrides=()) -> Config:
    """The run's config: the teacher's, named ``<teacher>-distilled``, with ``config_file``'s ``[distill]`` section
    (and ``name``) and then ``overrides`` (``section.key=value``, any section) applied."""
    return from_dict(apply_overrides(_distill_values(teacher.to_dict(), teacher.name, config_file), list(overrides)))


def check_settings(config_file: str | Path | None = None, overrides=()) -> None:
    """The ``[distill]`` settings alone, checked before anything loads or is written (:class:`ConfigError`); the
    rest of the run's config is the teacher's, checked once it is loaded (:func:`run_config`)."""
    values = _distill_values({}, "teacher", config_file)
    from_dict(apply_overrides(values, [item for item in overrides if str(item).startswith("distill.")]))


def _distill_values(values: dict, teacher_name: str, config_file) -> dict:
    # A progressive student halved further keeps its run's name rather than gaining a second suffix.
    name = teacher_name if teacher_name.endswith("-distilled") else f"{teacher_name}-distilled"
    values = dict(values, name=name)
    if config_file is not None:
        given, _ = named_config.read(config_file)
        extra = sorted(set(given) - {"name", "distill"})
        if extra:
            raise ConfigError(f"a distillation config holds [distill] and name only (the rest is the teacher's); "
                              f"{config_file} also has {', '.join(extra)} (use --set for those)")
        values["name"] = given.get("name", values["name"])
        values["distill"] = given.get("distill", {})
    return values


def check_teacher_record(workdir: Path, source: str, step: int | None) -> None:
    """The first record of ``distill.jsonl`` names the teacher; a resumed run must have the same one."""
    path = Workdir(workdir).distill_file
    first = next(iter(read_records(path)), None)
    if first is None:
        workdir.mkdir(parents=True, exist_ok=True)
        append_record(path, {"teacher": source, "teacher_step": step})
        return
    if (first.get("teacher"), first.get("teacher_step")) != (source, step):
        raise TrainingError(f"{workdir} distils {first.get('teacher')} (step {first.get('teacher_step')}), not "
                            f"{source} (step {step}); give that teacher to resume, or use another --workdir")
