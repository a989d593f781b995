"""Stages 1 and 2 of an alignment: the problems, and the target's solutions to them.

*Problems* (``problems.jsonl``): generated (:mod:`stepspec.workflows.eval.training_problems`), a
quarter more than asked, near duplicates of any evaluation question dropped, the first
``num_problems`` kept. Written once; a resumed run reads them back.

*Solutions* (``solutions.jsonl``, one line per problem as it finishes): the target alone
writes a greedy step-by-step solution to each, many at once, in the prompt every strategy
uses; the line records whether its ``\\boxed{}`` answer is right. Only right ones are
trained on. A resumed run solves only the problems without a line. ``manifest.json``
counts them, with the seed, the models and the settings.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

from stepspec.common.files import JsonlError, append_jsonl, atomic_write_json, read_jsonl, write_jsonl
from stepspec.engine.protocol import Engine
from stepspec.orchestrator.reasoner import Reasoner, check_reasoner
from stepspec.workflows.align.settings import AlignError, AlignFiles, AlignSettings
from stepspec.workflows.eval.datasets import Problem
from stepspec.workflows.eval.graders import get_grader
from stepspec.workflows.eval.rundir import git_hash, hardware, versions
from stepspec.workflows.eval.training_problems import uncontaminated_problems

# Hears a stage's progress: (stage, done, total).
Progress = Callable[[str, int, int], None]


def quiet(stage: str, done: int, total: int) -> None:
    pass


def _records(path, what: str) -> list[dict[str, Any]]:
    try:
        return list(read_jsonl(path, lambda r: dict(r, id=int(r["id"])), repair=True).records)
    except JsonlError as e:
        raise AlignError(f"{e.path}:{e.lineno}: malformed {what} line ({e.cause}); remove it to resume") from e


def make_problems(spec: AlignSettings, files: AlignFiles) -> list[Problem]:
    """The run's training problems (generated once, then read back)."""
    if files.problems.is_file():
        return [Problem(r["source"], r["id"], r["question"], r["answer"]) for r in _records(files.problems, "problem")]
    drawn = uncontaminated_problems(spec.num_problems, spec.seed, spec.generators, spec.data_dir)
    kept = drawn.problems
    if len(kept) < spec.num_problems:
        raise AlignError(f"only {len(kept)} of {spec.num_problems} generated problems are not near duplicates of an "
                         "evaluation question; choose other --generators or fewer --num-problems")
    files.directory.mkdir(parents=True, exist_ok=True)
    write_jsonl(files.problems, ({"id": n, "source": p.dataset, "question": p.question, "answer": p.reference}
                                 for n, p in enumerate(kept)))
    atomic_write_json(files / "problems.json", {"drawn": drawn.num_drawn, "near_duplicates_dropped": drawn.num_dropped,
                                                "kept": len(kept), "seed": spec.seed, "generators": spec.generators})
    return [Problem(p.dataset, n, p.question, p.reference) for n, p in enumerate(kept)]


async def write_solutions(spec: AlignSettings, files: AlignFiles, problems: list[Problem], *,
                          engines: tuple[Engine, Engine | None] | None = None,
                          on_progress: Progress = quiet) -> dict[str, Any]:
    """Solve the problems without a solution line; returns the manifest."""
    done = {r["id"] for r in _records(files.solutions, "solution")}
    todo = [p for p in problems if p.index not in done]
    grader = get_grader("numeric")
    on_progress("solutions", len(done), len(problems))
    if todo:
        config = spec.reasoner_config()
        check_reasoner(config)
        reasoner = Reasoner.from_config(config, engines=engines)
        gate, t0 = asyncio.Semaphore(spec.concurrency), time.perf_counter()

        async def one(p: Problem) -> None:
            async with gate:
                solution = await reasoner.asolve(p.question)
            trace = solution.trace
            (grade,) = grader.grade(trace.text, p.reference).values()
            append_jsonl(files.solutions, {
                "id": p.index, "source": p.dataset, "question": p.question, "answer": p.reference,
                "text": trace.text, "extracted": grade.extracted, "correct": grade.correct,
                "num_tokens": trace.num_tokens, "stop_reason": trace.stop_reason, "seconds": trace.seconds})
            done.add(p.index)
            on_progress("solutions", len(done), len(problems))

        try:
            await asyncio.gather(*(one(p) for p in todo))
        finally:
            await reasoner.aclose()
            write_manifest(spec, files, time.perf_counter() - t0)  # an interrupted run counts what it has
        return json.loads(files.manifest.read_text())
    return write_manifest(spec, files, 0.0)


def write_manifest(spec: AlignSettings, files: AlignFiles, seconds: float) -> dict[str, Any]:
    records = _records(files.solutions, "solution")
    old = json.loads(files.manifest.read_text()) if files.manifest.is_file() else {}
    by_source: dict[str, list[int]] = {}
    for r in records:
        by_source.setdefault(r["source"], [0, 0])
        by_source[r["source"]][0] += 1
        by_source[r["source"]][1] += bool(r["correct"])
    manifest = {
        "num_problems": spec.num_problems, "num_solved": len(records),
        "num_correct": sum(1 for r in records if r["correct"]),
        "num_tokens_correct": sum(r["num_tokens"] for r in records if r["correct"]),
        "by_generator": {k: {"solved": v[0], "correct": v[1]} for k, v in sorted(by_source.items())},
        "seed": spec.seed, "target": spec.target, "draft": spec.draft, "target_spec": spec.target_spec,
        "target_dtype": spec.target_dtype, "max_tokens": spec.max_tokens,
        "seconds": old.get("seconds", 0.0) + seconds,
        "versions": versions(), "git_hash": git_hash(), "hardware": hardware(),
    }
    atomic_write_json(files.manifest, manifest)
    return manifest


def training_split(files: AlignFiles, held_out: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held out): the right solutions, split by problem, seeded."""
    import random

    right = sorted((r for r in _records(files.solutions, "solution") if r["correct"]), key=lambda r: r["id"])
    if len(right) < 4:
        raise AlignError(f"{files.solutions}: only {len(right)} right solutions; solve more problems "
                         "(--num-problems) before training")
    order = list(right)
    random.Random(seed).shuffle(order)
    k = max(1, round(held_out * len(order)))
    return order[k:], order[:k]
