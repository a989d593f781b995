"""``stepspec router collect``: training data for a learned router, from stepspec's own traces.

Every training problem is solved with ``arbitrage-oracle``: at each step the
draft and the target both write a candidate from the same prefix, the judge
(default: the target's 0-9 self-score) rates both, and the better one stays.
Every position is one :class:`stepspec.routers.base.RoutingExample` (both candidates,
the draft's token logprobs and entropies, both ratings), appended to
``examples.jsonl`` and flushed as it is made. A finished problem adds one line
to ``problems.jsonl``. ``collect.json`` holds the config and each session.

Training problems never come from the evaluation sets: by default they are
generated (``generated``: reasoning-gym's procedural problems, offline, seeded,
:mod:`stepspec.workflows.eval.training_problems`, near duplicates of an evaluation question
dropped); a user's JSONL is checked against the evaluation files in the data folder
and refused if any question is one of theirs or a near duplicate of one.

Collection is append-only and resumable: run the same command again and the
finished problems are skipped; a problem that was in flight is collected again
(its later examples replace the earlier ones in training).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from pydantic import Field

from stepspec.common.states import Author
from stepspec.common.files import JsonlError, append_jsonl, atomic_write_json, read_jsonl, resume_record
from stepspec.engine.exclusive import TurnTaking
from stepspec.engine.protocol import Engine
from stepspec.engine.config import build_engines
from stepspec.judges.registry import make_judge
from stepspec.orchestrator.arbitrage import ArbitrageOracle
from stepspec.orchestrator.driver import StrategyOptions, drive
from stepspec.orchestrator.config import ReasonerConfig, RunSettings
from stepspec.orchestrator.reasoner import check_reasoner
from stepspec.orchestrator.run import ReasoningError
from stepspec.orchestrator.steps import StepRules
from stepspec.routers.base import RoutingExample
from stepspec.workflows.eval.rundir import git_hash, hardware, versions
from stepspec.workflows.eval.datasets import DATASETS, DatasetError, Problem, load_dataset
from stepspec.workflows.eval.training_problems import near_duplicates, uncontaminated_problems
from stepspec.workflows.eval.graders import get_grader

logger = logging.getLogger(__name__)

GENERATED = "generated"


class CollectError(ValueError):
    """A collection cannot start or resume; the message names the problem and the fix."""


class CollectSettings(RunSettings):
    """What a collection is (saved in collect.json; a resumed run must match it): the
    problems, the judge that rates both candidates, and the models, budget and delimiter
    (:class:`stepspec.orchestrator.config.RunSettings`)."""

    source: str = Field(GENERATED, description="generated (reasoning-gym's problems, offline; near duplicates of "
                        "an evaluation question dropped) or a JSONL file of your own (never an evaluation set).")
    num_problems: int = Field(200, ge=1, description="Training problems to collect.")
    seed: int = Field(0, description="Seed of the generated problems.")
    question_field: str | None = Field(None, description="JSONL: field holding the question.")
    answer_field: str | None = Field(None, description="JSONL: field holding the reference answer.")
    data_dir: str | None = Field(None, description="Folder with the evaluation sets (checked for overlap).")
    judge: str = Field("score", description="Judge that rates each candidate step (must give a score).")
    judge_options: dict[str, Any] = Field(default_factory=dict, description="Any judge option.")

    def reasoner_config(self, **settings: Any) -> ReasonerConfig:
        """The collection's reasoner: ``arbitrage-oracle`` with the spec's judge."""
        return super().reasoner_config(strategy="arbitrage-oracle", judge=self.judge,
                                       judge_options=self.judge_options, **settings)


@dataclass(frozen=True)
class CollectFiles:
    directory: Path

    @property
    def config(self) -> Path:
        return self.directory / "collect.json"

    @property
    def examples(self) -> Path:
        return self.directory / "examples.jsonl"

    @property
    def problems(self) -> Path:
        return self.directory / "problems.jsonl"


def training_problems(spec: CollectSettings) -> list[Problem]:
    """The spec's training problems; never an evaluation set's, nor a near duplicate of one."""
    if spec.source == GENERATED:
        return uncontaminated_problems(spec.num_problems, spec.seed, data_dir=spec.data_dir).problems
    if spec.source == "gsm-symbolic":
        raise CollectError("gsm-symbolic's templates are GSM8K test problems with new names and numbers: a router "
                           "trained on them is scored on what it saw. Use --source generated")
    if spec.source in DATASETS:
        raise CollectError(f"'{spec.source}' is an evaluation set: training a router on it would leak into the "
                           "benchmark. Use --source generated or a JSONL file of your own")
    try:
        dataset = load_dataset(spec.source, spec.data_dir, question_field=spec.question_field,
                               answer_field=spec.answer_field, grader="numeric")
    except DatasetError as e:
        raise CollectError(str(e)) from e
    problems = list(dataset.problems[:spec.num_problems])
    leaked = sorted({hit.training for hit in near_duplicates([p.question for p in problems], spec.data_dir)})
    if leaked:
        raise CollectError(f"{spec.source}: {len(leaked)} questions (lines {', '.join(str(i + 1) for i in leaked[:5])}"
                           f"{', ...' if len(leaked) > 5 else ''}) are in the evaluation sets or near duplicates of "
                           "their questions; remove them: a router trained on them would be scored on what it saw")
    return problems


def _read_jsonl_ids(path: Path, key: str) -> set:
    """The ``key`` of every record (a last line cut off mid-write: that problem is collected again)."""
    try:
        return set(read_jsonl(path, lambda record: record[key]).records)
    except JsonlError as e:
        raise CollectError(f"{e.path}:{e.lineno}: malformed line ({e.cause}); remove it to resume") from e


async def collect(spec: CollectSettings, out_dir: str | os.PathLike, *, concurrency: int = 8, overlap: bool = False,
                  engines: tuple[Engine, Engine] | None = None,
                  on_problem: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Collect (or continue collecting) into ``out_dir``; returns the collection's summary.

    ``engines``: (target, draft) instead of vLLM engines built from the spec (tests).
    ``concurrency``: problems in flight at once (the engines batch their steps).
    ``overlap``: let the two engines compute at the same time; by default they take
    turns (:mod:`stepspec.engine.exclusive`), which is much faster when they share CPU cores."""
    if concurrency < 1:
        raise CollectError(f"concurrency must be >= 1, got {concurrency}")
    files = CollectFiles(Path(out_dir))
    info = resume_record(files.config, spec, error=CollectError, what="a collection")
    config = spec.reasoner_config()
    check_reasoner(config)  # the judge, its options and the models, before any model is prepared
    problems = training_problems(spec)
    grader = get_grader("numeric")
    rules, budget = StepRules(delimiter=config.delimiter), config.budget
    finished = _read_jsonl_ids(files.problems, "problem_id")
    todo = [p for p in problems if f"{spec.source}:{spec.seed}:{p.index}" not in finished]
    files.directory.mkdir(parents=True, exist_ok=True)
    session: dict[str, Any] = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "num_problems": 0, "num_examples": 0, "seconds": None, "concurrency": concurrency,
                               "overlap": overlap,
                               "versions": versions(), "git_hash": git_hash(), "hardware": hardware()}
    info["sessions"].append(session)

    def save() -> None:
        atomic_write_json(files.config, info)

    save()
    if not todo:
        return summary(files)
    target, draft, owned, turns = _engines(spec, config, engines, overlap)
    judge = make_judge(spec.judge, engine=target,
                       **({"step_delimiter": spec.delimiter} if spec.judge == "score" else {}), **spec.judge_options)
    gate = asyncio.Semaphore(concurrency)
    t_run = time.perf_counter()

    async def one(p: Problem) -> None:
        pid = f"{spec.source}:{spec.seed}:{p.index}"

        def write(ex: RoutingExample) -> None:
            append_jsonl(files.examples, ex.to_dict())
            session["num_examples"] += 1

        async with gate:
            try:
                oracle = ArbitrageOracle(StrategyOptions(), judge, on_example=write, problem_id=pid)
                trace = await drive(oracle, p.question, {Author.DRAFT: draft, Author.TARGET: target}, rules=rules,
                                    budget=budget)
            except ReasoningError as e:
                trace = e.trace
            (grade,) = grader.grade(trace.text, p.reference).values()
            record = {"problem_id": pid, "question": p.question, "reference": p.reference,
                      "answer": grade.extracted, "correct": grade.correct, "num_steps": len(trace.steps),
                      "num_target_won": sum(1 for s in trace.steps if s.author is Author.TARGET),
                      "stop_reason": trace.stop_reason, "error": trace.error, "seconds": trace.seconds}
            if trace.error is None:  # a problem cut short by an engine failure is collected again
                append_jsonl(files.problems, record)
            session["num_problems"] += 1
            session["seconds"] = time.perf_counter() - t_run
            save()
            if on_problem is not None:
                on_problem(record)

    try:
        for engine in (target, draft):
            await engine.start()
        # what each engine computes in (dtype "auto" is probed per machine) and why
        session["engines"] = {role: asdict(e.info) for role, e in ((Author.TARGET, target), (Author.DRAFT, draft))}
        save()
        await asyncio.gather(*(one(p) for p in todo))
    finally:
        session["seconds"] = time.perf_counter() - t_run
        session["num_engine_turns"] = turns.num_turns if turns is not None else None
        save()
        for engine in owned:
            await engine.close()
    return summary(files)


def _engines(spec: CollectSettings, config: Any, engines: tuple[Engine, Engine] | None, overlap: bool):
    """(target, draft, the engines to close, their turn-taking or None): built from the spec
    unless given; taking turns unless ``overlap``."""
    if engines is None:
        built = build_engines({Author.TARGET: config.target, Author.DRAFT: config.draft},
                              names={Author.TARGET: spec.target, Author.DRAFT: spec.draft})
        target, draft = built[Author.TARGET], built[Author.DRAFT]
        owned = [target, draft]
    else:
        (target, draft), owned = engines, []
    turns = None
    if not overlap:
        turns = TurnTaking()
        target, draft = turns.wrap(target), turns.wrap(draft)
    return target, draft, owned, turns


def summary(files: CollectFiles) -> dict[str, Any]:
    from stepspec.routers.train import read_examples

    examples, _ = read_examples(files.examples) if files.examples.is_file() else ([], 0)
    problems = [json.loads(line) for line in files.problems.read_text().splitlines() if line.strip()] \
        if files.problems.is_file() else []
    rated = [ex for ex in examples if ex.advantage is not None]
    return {
        "directory": str(files.directory),
        "num_problems": len(problems),
        "num_examples": len(examples),
        "num_rated": len(rated),
        "target_better_share": (sum(1 for ex in rated if ex.advantage > 0) / len(rated)) if rated else None,
        "oracle_accuracy": (sum(1 for p in problems if p["correct"]) / len(problems)) if problems else None,
    }
