"""``stepspec draft align``: a draft aligned to its target, in four resumable stages.

1. *problems*: generated, never from a benchmark (:mod:`stepspec.workflows.align.data`);
2. *solutions*: the target's own greedy solutions, the right ones kept;
3. *training*: LoRA on the draft, loss on the solution tokens (:mod:`stepspec.workflows.align.train`);
4. *merge*: the adapter merged into a model usable by name (:mod:`stepspec.workflows.align.merge`).

Every stage writes into one work folder and a run of the same command continues where the
last one stopped; ``align.json`` holds the settings (a resumed run must match them) and a
line per session.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable

from stepspec.common.files import atomic_write_json, resume_record
from stepspec.engine.protocol import Engine
from stepspec.workflows.align.data import Progress, make_problems, quiet, write_solutions
from stepspec.workflows.align.merge import check_name_free, export, merge
from stepspec.workflows.align.settings import AlignError, AlignFiles, AlignSettings
from stepspec.workflows.align.train import train
from stepspec.workflows.eval.rundir import git_hash, hardware

STAGES = ("problems", "solutions", "train", "merge")


def align(spec: AlignSettings, out_dir: str | Path, *, command: str, until: str = "merge",
          export_to: str | Path | None = None, engines: tuple[Engine, Engine | None] | None = None,
          on_progress: Progress = quiet, run_async: Callable[[Callable[[], Awaitable[Any]]], Any] | None = None
          ) -> dict[str, Any]:
    """Run (or continue) the stages up to ``until``; returns what each finished stage made.
    ``run_async(make)`` runs the solutions stage's coroutine (the command line's cancels it
    on Ctrl-C or SIGTERM, so the engines stop with it)."""
    if until not in STAGES:
        raise AlignError(f"unknown stage '{until}'; choose one of {', '.join(STAGES)}")
    files = AlignFiles(Path(out_dir))
    info = resume_record(files.config, spec, error=AlignError, what="an alignment")
    if until == "merge":
        check_name_free(spec, files)
    files.directory.mkdir(parents=True, exist_ok=True)
    session = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "until": until,
               "git_hash": git_hash(), "hardware": hardware()}
    info["sessions"].append(session)
    atomic_write_json(files.config, info)
    out: dict[str, Any] = {"directory": str(files.directory)}
    problems = make_problems(spec, files)
    out["problems"] = len(problems)
    if until != "problems":
        run_async = run_async or (lambda make: asyncio.run(make()))
        out["solutions"] = run_async(lambda: write_solutions(spec, files, problems, engines=engines,
                                                             on_progress=on_progress))
    if until in ("train", "merge"):
        out["evaluation"] = train(spec, files, on_progress=on_progress)
    if until == "merge":
        out["model"] = str(merge(spec, files, command))
        if export_to is not None:
            out["exported"] = export(files, Path(export_to))
    session["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    atomic_write_json(files.config, info)
    return out
