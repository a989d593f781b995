"""Benchmark problems: GSM8K, AIME 2024/2025 and MATH-500 by name, or any JSONL file;
and generated agent tasks (:mod:`stepspec.workflows.eval.agent_tasks`, ``agent-shop``).

Named sets come from a local data folder, found in order from an explicit
``data_dir``, the ``STEPSPEC_DATA_DIR`` environment variable, then
``../shared/data`` beside the project checkout or the current directory; or,
with ``source="hub"`` on a machine with internet, from the Hugging Face hub
through the ``datasets`` package. Any other JSONL file works with a field
mapping (``question_field``, ``answer_field``).

A malformed line is an error naming the file and line, before any model
runs; ``skip_bad_lines=True`` skips such lines instead, and the loaded
dataset lists them (``skipped``) so a run can report them.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from stepspec.workflows.eval.agent_tasks import TASK_SETS

DATA_ENV = "STEPSPEC_DATA_DIR"


@dataclass(frozen=True)
class DatasetInfo:
    """A named benchmark: its local file, fields, grader and hub location."""

    file: str
    question_field: str
    answer_field: str
    grader: str
    hub: tuple[str, str | None, str]  # (path, config, split) on the Hugging Face hub


DATASETS = {
    "gsm8k": DatasetInfo("gsm8k_test.jsonl", "question", "answer", "gsm8k", ("openai/gsm8k", "main", "test")),
    "aime24": DatasetInfo("aime24_test.jsonl", "problem", "answer", "aime", ("HuggingFaceH4/aime_2024", None, "train")),
    "aime25": DatasetInfo("aime25_test.jsonl", "problem", "answer", "aime", ("MathArena/aime_2025", None, "train")),
    "math500": DatasetInfo("math500_test.jsonl", "problem", "answer", "math", ("HuggingFaceH4/MATH-500", None, "test")),
}

# The AIME and MATH-500 files end each problem with this sentence; the reasoner adds its own.
_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."


class DatasetError(ValueError):
    """A data file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Problem:
    dataset: str
    index: int  # 0-based position among the file's problems
    question: str
    reference: str  # the reference answer as the file gives it (GSM8K: the worked solution)


@dataclass(frozen=True)
class Dataset:
    name: str
    source: str  # the file (or hub id) the problems came from
    grader: str
    problems: tuple[Problem, ...]
    skipped: tuple[tuple[int, str], ...] = ()  # (line number, why) of lines left out


def find_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    candidates: list[Path] = []
    if data_dir:
        candidates.append(Path(data_dir))
    elif os.environ.get(DATA_ENV):
        candidates.append(Path(os.environ[DATA_ENV]))
    else:
        project = Path(__file__).resolve().parents[3]  # the checkout
        candidates += [project.parent / "shared" / "data", Path.cwd() / "shared" / "data",
                       Path.cwd().parent / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c
    raise DatasetError(
        "no benchmark data folder found (looked in: "
        + ", ".join(str(c) for c in candidates)
        + f"); pass --data-dir or set {DATA_ENV} to the folder holding gsm8k_test.jsonl"
        + " (or use --source hub on a machine with internet)"
    )


def load_dataset(name: str, data_dir: str | os.PathLike | None = None, *, source: str = "local",
                 question_field: str | None = None, answer_field: str | None = None,
                 grader: str | None = None, skip_bad_lines: bool = False) -> Dataset:
    """A named dataset (``gsm8k``, ``aime24``, ``aime25``, ``math500``) or a JSONL file path.

    For a file, ``question_field``/``answer_field`` name its fields (default
    ``question``/``answer``) and ``grader`` how to grade it (default ``numeric``).
    """
    if source not in ("local", "hub"):
        raise DatasetError(f"unknown data source '{source}'; choose local or hub")
    if name in TASK_SETS:
        if source == "hub" or question_field or answer_field or (grader not in (None, "numeric")):
            raise DatasetError(f"'{name}' is generated here: it takes no --source hub, field mapping or grader")
        task, size = TASK_SETS[name]
        tasks = [task(i) for i in range(size)]
        return Dataset(name, f"generated ({name})", "numeric",
                       tuple(Problem(name, t.index, t.question, str(t.answer)) for t in tasks))
    spec = DATASETS.get(name)
    from_file = spec is None
    if from_file:
        path = Path(name)
        if not (name.endswith((".jsonl", ".json")) or path.is_file()):
            raise DatasetError(f"unknown dataset '{name}': give one of {', '.join([*DATASETS, *TASK_SETS])} or a "
                               "JSONL file path")
        if not path.is_file():
            raise DatasetError(f"dataset file {path} not found")
        if source == "hub":
            raise DatasetError("--source hub applies to the named datasets, not to a file")
        spec = DatasetInfo(str(path), question_field or "question", answer_field or "answer", grader or "numeric",
                           ("", None, ""))
        name = path.stem
    else:
        spec = DatasetInfo(spec.file, question_field or spec.question_field, answer_field or spec.answer_field,
                           grader or spec.grader, spec.hub)
    if source == "hub":
        return _load_hub(name, spec)
    path = Path(spec.file) if from_file else find_data_dir(data_dir) / spec.file
    if not path.is_file():
        raise DatasetError(f"dataset '{name}': file {path} not found")
    problems, skipped = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                question, answer = _fields(json.loads(line), spec)
            except (ValueError, KeyError, TypeError) as e:
                reason = f"{type(e).__name__}: {e}"
                if not skip_bad_lines:
                    raise DatasetError(
                        f"{path}:{lineno}: malformed line ({reason}); expected a JSON object with fields "
                        f"'{spec.question_field}' and '{spec.answer_field}' (fix the line, map the fields with "
                        "--question-field/--answer-field, or pass --skip-bad-lines)") from e
                skipped.append((lineno, reason))
                continue
            problems.append(Problem(name, len(problems), question, answer))
    if not problems:
        raise DatasetError(f"dataset '{name}': no problems in {path}")
    return Dataset(name, str(path), spec.grader, tuple(problems), tuple(skipped))


def _fields(row: object, spec: DatasetInfo) -> tuple[str, str]:
    if not isinstance(row, dict):
        raise TypeError(f"a line is a JSON {type(row).__name__}, not an object")
    question, answer = row[spec.question_field], row[spec.answer_field]
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"field '{spec.question_field}' is empty or not text")
    if answer is None or isinstance(answer, (dict, list)):
        raise ValueError(f"field '{spec.answer_field}' is not a single answer: {answer!r}")
    return question.replace(_SUFFIX, "").strip(), str(answer)


def _load_hub(name: str, spec: DatasetInfo) -> Dataset:
    try:
        import datasets as hf_datasets
    except ImportError as e:
        raise DatasetError("--source hub needs the `datasets` package: pip install datasets") from e
    hub_path, config, split = spec.hub
    try:
        rows = hf_datasets.load_dataset(hub_path, config, split=split)
    except Exception as e:  # noqa: BLE001 - any hub failure becomes one clear message
        raise DatasetError(f"dataset '{name}': could not load {hub_path} ({split}) from the Hugging Face hub: "
                           f"{e}; without internet use the local files (--data-dir)") from e
    problems = []
    for i, row in enumerate(rows):
        try:
            question, answer = _fields(row, spec)
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetError(f"{hub_path} row {i}: malformed ({type(e).__name__}: {e})") from e
        problems.append(Problem(name, len(problems), question, answer))
    return Dataset(name, f"hf://{hub_path}/{split}", spec.grader, tuple(problems))


def select(problems: tuple[Problem, ...] | list[Problem], *, offset: int = 0, limit: int | None = None,
           sample: int | None = None, seed: int = 0) -> list[Problem]:
    """Problems ``offset``.. ; with ``sample``, a seeded random sample of those (kept in
    file order); then the first ``limit``."""
    if offset < 0 or (limit is not None and limit < 0) or (sample is not None and sample < 1):
        raise DatasetError("--offset and --limit must be >= 0 and --sample >= 1")
    chosen = list(problems)[offset:]
    if sample is not None:
        if sample > len(chosen):
            raise DatasetError(f"--sample {sample} is more than the {len(chosen)} problems available")
        chosen = sorted(random.Random(seed).sample(chosen, sample), key=lambda p: p.index)
    return chosen if limit is None else chosen[:limit]


def load_problems(name: str, data_dir: str | os.PathLike | None = None) -> list[Problem]:
    """All problems of a named dataset or JSONL file (default fields)."""
    return list(load_dataset(name, data_dir).problems)
