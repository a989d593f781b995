"""Benchmark problems from local JSONL files.

The data folder is found, in order, from an explicit ``data_dir``, the
``STEPSPEC_DATA_DIR`` environment variable, then ``../shared/data`` beside the
project checkout or the current directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DATA_ENV = "STEPSPEC_DATA_DIR"

# name -> (file, question field, answer field)
DATASETS = {
    "gsm8k": ("gsm8k_test.jsonl", "question", "answer"),
    "aime24": ("aime24_test.jsonl", "problem", "answer"),
    "aime25": ("aime25_test.jsonl", "problem", "answer"),
    "math500": ("math500_test.jsonl", "problem", "answer"),
}

_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."


class DatasetError(ValueError):
    """A data file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Problem:
    dataset: str
    index: int  # 0-based position in the file
    question: str
    reference: str  # the reference answer as the file gives it (GSM8K: the worked solution)


def find_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    candidates: list[Path] = []
    if data_dir:
        candidates.append(Path(data_dir))
    elif os.environ.get(DATA_ENV):
        candidates.append(Path(os.environ[DATA_ENV]))
    else:
        project = Path(__file__).resolve().parent.parent
        candidates += [project.parent / "shared" / "data", Path.cwd() / "shared" / "data",
                       Path.cwd().parent / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c
    raise DatasetError(
        "no benchmark data folder found (looked in: "
        + ", ".join(str(c) for c in candidates)
        + f"); pass --data-dir or set {DATA_ENV} to the folder holding gsm8k_test.jsonl"
    )


def load_problems(name: str, data_dir: str | os.PathLike | None = None) -> list[Problem]:
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset '{name}'; choose one of: {', '.join(DATASETS)}")
    file, qf, af = DATASETS[name]
    path = find_data_dir(data_dir) / file
    if not path.is_file():
        raise DatasetError(f"dataset '{name}': file {path} not found")
    problems = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                question, answer = row[qf], row[af]
            except (ValueError, KeyError, TypeError) as e:
                raise DatasetError(
                    f"{path}:{lineno}: malformed line ({type(e).__name__}: {e}); expected a JSON "
                    f"object with fields '{qf}' and '{af}'"
                ) from e
            question = str(question).replace(_SUFFIX, "").strip()
            problems.append(Problem(name, len(problems), question, str(answer)))
    return problems
