"""``stepspec bench``: strategies side by side on the same problems, measured, not computed.

One run starts one pair of engines and gives every *arm* the same problems,
prompts, budgets and seed. An arm is a strategy under a label: a label that is
a strategy name is that strategy; any other label names its strategy in its
options (``strategy_options[label]["strategy"]``), so one strategy can run
several times with different options (``sr-score``: specreason with the score
judge, ``sr-lik``: specreason with the likelihood judge).

Two modes, measured separately:

* ``latency``: one problem at a time. Problems are interleaved: for each
  problem every arm solves it in turn, the order rotating from problem to
  problem, so drift of a shared machine hits all arms alike. Both engines'
  prefix caches are reset before every solve. Wall clock is measured around
  each solve. ``latency_limit`` keeps the first N problems, ``latency_strategies``
  the arms that run in this mode.
* ``throughput``: for each arm in turn, both prefix caches are reset and all
  the problems are solved concurrently by one reasoner (its goodput governor
  sees the load); the arm's wall time, from the first request to the last
  answer, is the measurement. ``throughput_wave`` splits the problems into
  *waves* of that many at once: every arm solves a wave in turn (the order
  rotating from wave to wave) before the next wave starts, and an arm's wall
  time is the sum of its waves'. A wave is resumed as a unit (one cut short
  runs again from scratch), and a speedup pairs only waves that one session
  timed for both arms. Worked example: 100 problems in waves of 25 and a run
  stopped in wave 3 keeps waves 1 and 2 of every arm; resumed the next day, it
  runs wave 3 again for the arms that had not finished it, then wave 4. Without
  waves the whole arm is the unit, and an arm timed on another day than the
  baseline gets no speedup (the same 100 target-only solves took 599 s in one
  session and 1078 s in another).

A run directory holds (lm-evaluation-harness style)::

    results_<timestamp>.json                      config, versions, git hash, metrics with standard
                                                  errors, throughput arms' wall times
    samples_<dataset>_<label>.jsonl               latency: one line per problem, appended and flushed
                                                  as it finishes
    samples_<dataset>_<label>_throughput.jsonl    throughput: the same, in the order problems finish
    report.md, *.png                              tables and plots (`stepspec bench report RUN_DIR`
                                                  rebuilds them)

``resume=True`` continues a run from its samples files: every (problem, arm)
of latency mode already there is skipped, every throughput arm with all its
problems saved is skipped. Ctrl-C leaves the files valid and the run
resumable; the results file then says ``"status": "interrupted"``. A resume
may run only some of the run's modes (``modes``); the run is then
``"incomplete"`` until a resume runs the rest. Each sample names the session
that solved it, and per-problem speedups pair solves of one session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import resource
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Mapping, Protocol

from pydantic import Field, ValidationError

from common.files import append_jsonl, atomic_write_json, write_jsonl
from common.names import did_you_mean
from engine.config import EngineConfig, EnginePair, OpenAIEngineConfig, build_engines, check_engine
from engine.protocol import Engine
from orchestrator.config import ReasonerConfig, RunSettings
from orchestrator.goodput import GoodputGovernor
from orchestrator.reasoner import Reasoner, check_reasoner
from orchestrator.run import ReasoningError
from orchestrator.strategies import STRATEGIES, get_strategy
from orchestrator.trace import Trace
from workflows.eval.datasets import Problem, load_dataset, select
from workflows.eval.graders import Grader, get_grader
from workflows.eval.report import summarize_run, write_report
from workflows.eval.rundir import (BenchError, RunFiles, find_results, git_hash, hardware, read_samples,
                                    versions)

logger = logging.getLogger(__name__)

BASELINE = "target-only"
Mode = Literal["latency", "throughput"]
# An arm's label names its samples files: letters, digits and - _ . +
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def _role_names(role: str, configs: list[EngineConfig]) -> list[str]:
    """A name per config of one role (equal configs, one name): the role alone when all are
    one engine, else the role and what tells them apart: a target's token method (and the
    model drafting inside it when two share the method), a draft's model; a number if still equal."""
    distinct = list(dict.fromkeys(configs))
    if len(distinct) <= 1:
        return [role] * len(configs)

    def method(c: EngineConfig) -> str:
        return getattr(c, "speculation", None) or "none"

    def tell(c: EngineConfig) -> str:
        if role == "draft":
            return f"draft ({Path(str(getattr(c, 'model', ''))).name})"
        if sum(method(d) == method(c) for d in distinct) > 1:
            return f"target ({method(c)}: {Path(str(getattr(c, 'draft_model', None) or '')).name or 'none'})"
        return f"target ({method(c)})"

    names = [tell(c) for c in distinct]
    names = [n if names.count(n) == 1 else f"{n} #{names[:k].count(n) + 1}" for k, n in enumerate(names)]
    return [names[distinct.index(c)] for c in configs]


class BenchSpec(RunSettings):
    """What a benchmark run is: data, arms, and the models, budgets and delimiter every arm
    shares (:class:`orchestrator.config.RunSettings`); saved in its results file."""

    dataset: str = Field("gsm8k", description="gsm8k, aime24, aime25, math500, or a JSONL file.")
    data_dir: str | None = Field(None, description="Folder with the benchmark JSONL files (default: "
                                 "$STEPSPEC_DATA_DIR, then ../shared/data).")
    source: Literal["local", "hub"] = Field("local", description="local files, or hub (Hugging Face, needs internet "
                                            "and `datasets`).")
    question_field: str | None = Field(None, description="JSONL field holding the question.")
    answer_field: str | None = Field(None, description="JSONL field holding the reference answer.")
    grader: str | None = Field(None, description="gsm8k, aime, math or numeric (default: the dataset's).")
    skip_bad_lines: bool = Field(False, description="Skip malformed data lines (listed in the results) instead of "
                                 "stopping.")
    offset: int = Field(0, ge=0, description="Skip this many problems first.")
    limit: int | None = Field(None, ge=1, description="At most this many problems.")
    sample: int | None = Field(None, ge=1, description="A random sample of this many problems (seeded).")
    seed: int = Field(0, description="Seed of the sample.")
    strategies: tuple[str, ...] = Field(("target-only", "specreason", "lookahead"), description="Arms: strategy "
                                        "names, or labels of arms whose strategy is given by --opt "
                                        "LABEL.strategy=NAME (one strategy with different options).")
    # Per arm: Reasoner keywords (judge, judge_options, gamma, first_target_steps, ...) and,
    # for a label that is not a strategy name, "strategy".
    strategy_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    modes: tuple[Mode, ...] = Field(("latency",), description="latency (one problem at a time, arms interleaved), "
                                    "throughput (per arm, all problems at once; its wall time) or both (throughput "
                                    "first).")
    latency_limit: int | None = Field(None, ge=1, description="Latency mode: only the first N selected problems.")
    latency_strategies: tuple[str, ...] | None = Field(None, description="Latency mode: only these arms (default "
                                                       "all).")
    throughput_wave: int | None = Field(None, ge=1, description="Throughput mode: the problems in waves of this "
                                        "many at once, every arm a wave in turn before the next; a finished wave is "
                                        "kept when the run resumes (default: one wave of all the problems).")
    # max_num_seqs (RunSettings) is raised to the problems of a throughput wave.

    def strategy_of(self, label: str) -> str:
        """The strategy an arm runs (a label that is a strategy name is that strategy)."""
        return self.strategy_options.get(label, {}).get("strategy", label)

    def latency_arms(self) -> tuple[str, ...]:
        if "latency" not in self.modes:
            return ()
        return self.strategies if self.latency_strategies is None else self.latency_strategies

    def throughput_arms(self) -> tuple[str, ...]:
        return self.strategies if "throughput" in self.modes else ()

    def check(self) -> dict[str, Reasoner]:
        """Arms and modes: anything wrong is one clear error, before any model is prepared.
        Returns each arm's reasoner checked on stand-in engines (:func:`check_reasoner`; the
        models are checked by :func:`run_bench`, after the data)."""
        names = ", ".join(STRATEGIES)
        if not self.strategies:
            raise ValueError("no strategies to bench; give --strategies")
        for label in self.strategies:
            options = self.strategy_options.get(label, {})
            if "strategy" in options:
                strategy = options["strategy"]
                if not isinstance(strategy, str):
                    raise ValueError(f"arm '{label}': its strategy must be a strategy name, got {strategy!r}")
                get_strategy(strategy)  # unknown: the error names the close ones
                if label in STRATEGIES and strategy != label:
                    raise ValueError(f"'{label}' is the name of a strategy; label the arm running '{strategy}' "
                                     "otherwise (e.g. --opt my-arm.strategy=...)")
            elif label not in STRATEGIES:
                raise ValueError(f"unknown strategy '{label}'.{did_you_mean(label, STRATEGIES)} Strategies: {names}. To bench an arm under "
                                 f"this label, give its strategy: --opt {label}.strategy=NAME")
            if not LABEL.fullmatch(label) or label.endswith("_throughput"):
                raise ValueError(f"arm label '{label}' names files: use letters, digits and - _ . + (not ending "
                                 "in _throughput)")
        if len(set(self.strategies)) != len(self.strategies):
            raise ValueError(f"a strategy is listed twice: {','.join(self.strategies)}")
        unknown = set(self.strategy_options) - set(self.strategies)
        if unknown:
            raise ValueError(f"options given for strategies not in the run: {', '.join(sorted(unknown))}")
        if not self.modes or len(set(self.modes)) != len(self.modes):
            raise ValueError(f"modes must be latency, throughput or both, each once; got {self.modes}")
        if "throughput" not in self.modes and self.throughput_wave is not None:
            raise ValueError("--throughput-wave applies to throughput mode, which is not in this run (--mode "
                             "throughput or both)")
        if "latency" not in self.modes and (self.latency_limit is not None or self.latency_strategies is not None):
            raise ValueError("--latency-limit and --latency-strategies apply to latency mode, which is not in this "
                             "run (--mode latency or both)")
        if self.latency_strategies is not None:
            missing = [s for s in self.latency_strategies if s not in self.strategies]
            if missing:
                raise ValueError(f"--latency-strategies: {', '.join(missing)} not in --strategies "
                                 f"({','.join(self.strategies)})")
            if not self.latency_strategies or len(set(self.latency_strategies)) != len(self.latency_strategies):
                raise ValueError(f"--latency-strategies must name arms, each once; got "
                                 f"{','.join(self.latency_strategies)!r}")

        configs = {label: self.arm_config(label) for label in self.strategies}  # each names its arm
        return {label: self._named(label, lambda: check_reasoner(configs[label], models=False))
                for label in self.strategies}

    def arm_config(self, label: str, max_concurrency: int | None = None) -> ReasonerConfig:
        """The reasoner an arm runs: the run's engines, budget and delimiter, the arm's options
        (an engine setting among them, e.g. ``target_spec``, is the arm's own: its own engine)."""
        options = dict(self.strategy_options.get(label, {}))
        strategy = options.pop("strategy", label)
        engine = {key: options.pop(key) for key in list(options) if key in EnginePair.model_fields}
        if max_concurrency is not None:
            options["max_concurrency"] = max_concurrency

        def config() -> ReasonerConfig:
            try:
                own = RunSettings.model_validate({**self.model_dump(include=set(RunSettings.model_fields)), **engine})
            except ValidationError as e:  # one line per bad setting, as the spec's own errors read
                raise ValueError("; ".join(f"{'.'.join(map(str, err['loc'])) or 'engines'}: "
                                           f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors())) from e
            return own.reasoner_config(strategy=strategy, **options)
        return self._named(label, config)

    def arm_engines(self) -> tuple[dict[str, EngineConfig], dict[str, tuple[str | None, str | None]]]:
        """The engines the run needs, by role, and each arm's (target role, draft role): one
        engine per distinct config the arms ask of each role (``target_spec`` auto: each
        strategy's own method; an arm's own ``draft``: its own draft engine), named "target"
        and "draft" when there is one, else by what tells them apart: "target (METHOD)",
        "draft (MODEL)". An arm whose strategy never asks the target or the draft gets none."""
        wanted = {label: (get_strategy(self.strategy_of(label)), self.arm_config(label)) for label in self.strategies}
        targets = [c.target for strategy, c in wanted.values() if strategy.needs_target]
        drafts = [c.draft for strategy, c in wanted.values() if strategy.needs_draft and c.draft is not None]
        target_names, draft_names = _role_names("target", targets), _role_names("draft", drafts)
        configs: dict[str, EngineConfig] = {}
        roles: dict[str, tuple[str | None, str | None]] = {}
        for label, (strategy, c) in wanted.items():
            target = draft = None
            if strategy.needs_target:
                target = target_names[targets.index(c.target)]
                configs[target] = c.target
            if strategy.needs_draft and c.draft is not None:
                draft = draft_names[drafts.index(c.draft)]
                configs[draft] = c.draft
            roles[label] = (target, draft)
        return configs, roles

    def reasoners(self, engines: Mapping[str, tuple[Engine | None, Engine | None]],
                  arms: tuple[str, ...] | None = None, max_concurrency: int = 8) -> dict[str, Reasoner]:
        """One reasoner per arm over the shared engines (``engines``: each arm's target and draft)."""
        return {label: Reasoner.from_config(self.arm_config(label, max_concurrency), engines=engines[label])
                for label in (self.strategies if arms is None else arms)}

    def _named(self, label: str, make: Any) -> Any:
        """``make()``, an error naming the arm when its label is not its strategy."""
        strategy = self.strategy_of(label)
        try:
            return make()
        except ValueError as e:
            if label == strategy:
                raise
            message = f"arm '{label}' ({strategy}): {e}"
            try:
                named = type(e)(message)  # the same kind of error (JudgeError, StrategyError, ...)
            except Exception:
                named = ValueError(message)
            raise named from e


class BenchProgress(Protocol):
    """What a run tells whoever shows its progress (the CLI's live bar). ``start`` comes
    once per mode, with the keys (``progress_key``) of that mode's arms."""

    def start(self, strategies: tuple[str, ...], num_problems: int, done: dict[str, list[dict]],
              metric: str) -> None: ...

    def sample(self, record: dict[str, Any]) -> None: ...


def progress_key(arm: str, mode: str = "latency") -> str:
    """How a progress listener tells an arm's modes apart: the label, "label [throughput]"."""
    return arm if mode == "latency" else f"{arm} [{mode}]"


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


def arm_info(spec: BenchSpec, label: str, reasoner: Reasoner) -> dict[str, Any]:
    """What an arm runs: its strategy, judge (or router), the options given, and the target's
    token-level speculation (its strategy's own with target_spec auto; None: it never asks the target)."""
    options = {k: v for k, v in spec.strategy_options.get(label, {}).items() if k != "strategy"}
    judge = reasoner.judge
    target = spec.arm_config(label).target if reasoner.strategy.needs_target else None
    return {"strategy": spec.strategy_of(label), "judge": None if judge is None else judge.name,
            "router": None if reasoner.router is None else reasoner.router.name, "options": options,
            "target_spec": None if target is None else getattr(target, "speculation", None) or "none"}


def sample_record(problem: Problem, strategy: str, position: int, trace: Trace, grader: Grader,
                  mode: str = "latency", *, session: int) -> dict[str, Any]:
    """One problem solved by one arm (``strategy``: its label), as its samples line holds it;
    ``session``: the run's session that solved it (its index in the results file's sessions)."""
    response = trace.text
    grades = grader.grade(response, problem.reference)
    primary = grader.metrics[0]
    return {
        "doc_id": problem.index,
        "strategy": strategy,
        "mode": mode,
        "position": position,  # latency: order among the arms on this problem; throughput: the arm's turn
        "session": session,  # seconds compare within one session (a resumed run may see another machine)
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


def _config_as_run(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved run's config, as it ran: a run from before engines took a dtype computed in
    float32 on a CPU (what ``auto`` meant then), so a resume keeps it so, not ``auto``'s choice now."""
    config = saved["config"]
    on_gpu = any((s.get("hardware") or {}).get("gpu") for s in (saved.get("run") or {}).get("sessions", []))
    return {**{key: "float32" for key in ("target_dtype", "draft_dtype") if not on_gpu}, **config}


async def run_bench(spec: BenchSpec, run_dir: str | os.PathLike, *, resume: bool = False,
                    engines: tuple[Engine, Engine | None] | None = None,
                    progress: BenchProgress | None = None, modes: tuple[Mode, ...] | None = None) -> dict[str, Any]:
    """Run (or resume) a benchmark into ``run_dir``; returns the results file's content.

    ``engines``: (target, draft) to use instead of building vLLM engines from the
    spec (tests pass scripted engines). ``progress`` hears of each record as it is saved.
    ``modes``: run only these of the run's modes in this session (default: all of them);
    the others wait for a later resume, and the run is saved as ``incomplete``. Example:
    a run of both modes whose throughput waves outlast the time at hand resumes with
    ``modes=("latency",)`` to spend it on latency problems, each timed on its own.
    """
    run_dir = Path(run_dir)
    if resume:
        files = RunFiles(run_dir, find_results(run_dir))
        saved = json.loads(files.results.read_text())
        try:
            spec = BenchSpec.model_validate(_config_as_run(saved))
        except (KeyError, ValidationError) as e:
            raise BenchError(f"{files.results}: its config cannot be read back ({e})") from e
    else:
        if run_dir.exists() and any(run_dir.glob("results_*.json")):
            raise BenchError(f"{run_dir} already holds a run; resume it with --resume {run_dir}, or pick "
                             "another --output-dir")
        stamp = datetime.now().strftime("%Y-%m-%dT%H-%M-%S")
        files = RunFiles(run_dir, run_dir / f"results_{stamp}.json")
        saved = {}

    # Everything that can be wrong with the spec fails here, before a model is prepared.
    checked = spec.check()
    session_modes = spec.modes if modes is None else modes
    if not set(session_modes) <= set(spec.modes) or not session_modes:
        raise BenchError(f"{run_dir}: this session's modes {', '.join(session_modes) or '(none)'} are not among "
                         f"the run's ({', '.join(spec.modes)}); name one of those, or none for all")
    dataset = load_dataset(spec.dataset, spec.data_dir, source=spec.source, question_field=spec.question_field,
                           answer_field=spec.answer_field, grader=spec.grader, skip_bad_lines=spec.skip_bad_lines)
    problems = select(dataset.problems, offset=spec.offset, limit=spec.limit, sample=spec.sample, seed=spec.seed)
    grader = get_grader(dataset.grader)
    for p in problems:
        grader.gold(p.reference)  # a reference the grader cannot read fails now, not mid-run
    for config in spec.arm_engines()[0].values() if engines is None else ():
        check_engine(config)  # an unknown model, before any is prepared and before the run has files
    latency_arms, throughput_arms = spec.latency_arms(), spec.throughput_arms()
    latency_problems = problems[:spec.latency_limit] if spec.latency_limit else problems

    def samples_file(arm: str, mode: str) -> Path:
        return files.samples(dataset.name, arm, mode)

    done: dict[str, dict[int, dict]] = {s: {r["doc_id"]: r for r in read_samples(samples_file(s, "latency"),
                                                                                 repair=True)}
                                        for s in latency_arms}
    done_tp: dict[str, dict[int, dict]] = {s: {r["doc_id"]: r for r in read_samples(samples_file(s, "throughput"),
                                                                                    repair=True)}
                                           for s in throughput_arms}
    run_info: dict[str, Any] = saved.get("run") or {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "sessions": []}
    run_info.update(dataset_source=dataset.source, grader=grader.name, metrics=list(grader.metrics),
                    problem_ids=[p.index for p in problems], skipped_lines=[list(s) for s in dataset.skipped],
                    samples={s: samples_file(s, "latency").name for s in latency_arms},
                    modes=list(spec.modes), latency_problem_ids=[p.index for p in latency_problems],
                    throughput_samples={s: samples_file(s, "throughput").name for s in throughput_arms},
                    arms={s: arm_info(spec, s, checked[s]) for s in spec.strategies})
    # Per throughput arm: its waves (problems, wall time, the session that timed it, whether
    # it finished), their total wall time, and whether all finished.
    throughput_runs: dict[str, dict[str, Any]] = run_info.setdefault("throughput", {})
    wave_size = spec.throughput_wave or len(problems)
    waves = [problems[i:i + wave_size] for i in range(0, len(problems), wave_size)]
    # Time accounting of this session: the latency loop's wall time, and within it the
    # solves, their model calls and the prefix-cache resets (engine calls too); the
    # throughput arms' wall time.
    session = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "modes": list(session_modes),
               "startup_seconds": None,
               "seconds": None, "num_solved": 0, "loop_seconds": 0.0, "solve_seconds": 0.0, "model_seconds": 0.0,
               "reset_seconds": 0.0, "throughput_seconds": 0.0, "versions": versions(), "git_hash": git_hash(),
               "hardware": hardware()}

    def recorded_wave(arm: str, w: int) -> dict[str, Any]:
        """What the results file says of an arm's wave (older files: the arm is its one wave)."""
        entry = throughput_runs.get(arm, {})
        recorded = entry["waves"] if "waves" in entry else [entry]
        return recorded[w] if w < len(recorded) else {}

    def complete_wave(arm: str, w: int) -> bool:
        return (recorded_wave(arm, w).get("status") == "complete"
                and all(p.index in done_tp[arm] for p in waves[w]))

    def complete_arm(arm: str) -> bool:
        return all(complete_wave(arm, w) for w in range(len(waves)))

    def save(status: str) -> dict[str, Any]:
        results: dict[str, Any] = {"config": spec.model_dump(mode="json"), "status": status,
                                   "baseline": BASELINE if BASELINE in spec.strategies else None}
        latency = {s: [done[s][p.index] for p in latency_problems if p.index in done[s]] for s in latency_arms}
        throughput = {s: [done_tp[s][p.index] for p in problems if p.index in done_tp[s]] for s in throughput_arms}
        results["results"], results["results_throughput"] = summarize_run({**results, "run": run_info},
                                                                          latency, throughput)
        results.update(overhead=overhead(run_info["sessions"]), run=run_info, versions=session["versions"],
                       git_hash=session["git_hash"])
        atomic_write_json(files.results, results)  # never a half-written results file
        return results

    todo = {"latency": [(p, s) for p in latency_problems for s in latency_arms if p.index not in done[s]],
            "throughput": [s for s in throughput_arms if not complete_arm(s)]}
    if not any(todo.values()):
        run_dir.mkdir(parents=True, exist_ok=True)
        results = save("complete")
        write_report(run_dir)
        return results
    if not any(todo[m] for m in session_modes):
        raise BenchError(f"{run_dir}: the run's {' and '.join(session_modes)} mode is done; resume it without a "
                         f"mode to run the rest ({', '.join(m for m in spec.modes if todo[m])})")
    # this session's work; the other modes' wait for a later resume
    latency_todo, throughput_todo = (todo[m] if m in session_modes else [] for m in ("latency", "throughput"))
    run_info["sessions"].append(session)  # a session that has work (a finished run's resume adds none)
    session_index = len(run_info["sessions"]) - 1  # what samples and waves name this session by

    # Throughput mode serves a wave's problems at once: each in-process engine must batch that
    # many sequences (a server batches as it was started).
    max_num_seqs = max(spec.max_num_seqs, wave_size) if throughput_todo else spec.max_num_seqs
    configs, roles = spec.model_copy(update={"max_num_seqs": max_num_seqs}).arm_engines()
    servers = [role for role, c in configs.items() if isinstance(c, OpenAIEngineConfig)]
    if max_num_seqs != spec.max_num_seqs:
        logger.info("throughput mode: max_num_seqs raised from %d to %d (the problems at once)%s",
                    spec.max_num_seqs, max_num_seqs,
                    f"; not for the {' and '.join(servers)} server, which batches as it was started" if servers else "")
    session["max_num_seqs"] = max_num_seqs
    if engines is None:
        built = build_engines(configs, names={role: c.model for role, c in configs.items()})
        owned = list(built.values())
    else:  # every arm on the engines given
        built, owned = {"target": engines[0], **({"draft": engines[1]} if engines[1] is not None else {})}, []
        roles = {label: ("target", "draft" if engines[1] is not None else None) for label in spec.strategies}
    # each arm's (target, draft); an arm that never asks the target (draft-only) holds any one
    any_target = next((e for role, e in built.items() if role.startswith("target")), None)
    arm_engines = {label: (built[t] if t else any_target, built[d] if d else None) for label, (t, d) in roles.items()}
    # Every solve (latency) and every arm's wave (throughput) starts cold: both engines' prefix
    # caches and token-speculation caches are reset first; an engine that cannot (a server,
    # unless its backend offers it) is named in the session and the report.
    resettable = dict(built)
    session["prefix_cache_reset"] = {role: hasattr(e, "reset_caches") for role, e in resettable.items()}
    for role, ok in session["prefix_cache_reset"].items():
        if not ok:
            logger.warning("the %s engine (%s) cannot reset its caches: its prefix cache carries over between "
                           "solves, so later solves of a problem may be served from it; compare arms on in-process "
                           "engines for latency", role, resettable[role].name)
    # The engines are built (models resolved, not loaded yet): from here on the run has files.
    run_dir.mkdir(parents=True, exist_ok=True)
    save("running")
    # Latency arms with work left; a throughput arm gets its own reasoner, built fresh when
    # its turn comes, with the goodput governor of its earlier waves in this session.
    latency_reasoners = spec.reasoners(arm_engines, tuple(s for s in latency_arms
                                                             if any(s == a for _, a in latency_todo)))
    session["routers"] = {s: router_info(r.router) for s, r in checked.items() if r.router is not None}
    governors: dict[str, GoodputGovernor] = {}

    async def reset_caches() -> None:
        t_reset = time.perf_counter()
        for role, engine in resettable.items():
            if session["prefix_cache_reset"][role]:
                await engine.reset_caches()
        session["reset_seconds"] += time.perf_counter() - t_reset

    def append(record: dict[str, Any], mode: str) -> None:
        append_jsonl(samples_file(record["strategy"], mode), record)

    async def run_latency() -> None:
        """Every latency problem, every latency arm in a rotating order, caches reset before each solve."""
        if progress is not None:
            progress.start(latency_arms, len(latency_problems),
                           {s: [done[s][p.index] for p in latency_problems if p.index in done[s]]
                            for s in latency_arms}, grader.metrics[0])
        t_loop = time.perf_counter()
        loop_before = session["loop_seconds"]
        for n, problem in enumerate(latency_problems):
            k = n % len(latency_arms)
            order = latency_arms[k:] + latency_arms[:k]
            for position, arm in enumerate(order):
                if problem.index in done[arm]:
                    continue
                await reset_caches()
                try:
                    trace = (await latency_reasoners[arm].asolve(problem.question)).trace
                except ReasoningError as e:  # an engine failed mid-trace: the partial trace is the sample
                    trace = e.trace
                record = sample_record(problem, arm, position, trace, grader, mode="latency",
                                       session=session_index)
                append(record, "latency")
                done[arm][problem.index] = record
                session["num_solved"] += 1
                session["solve_seconds"] += trace.seconds
                session["model_seconds"] += trace.model_seconds
                session["loop_seconds"] = loop_before + time.perf_counter() - t_loop
                save("running")  # the results file is current after every problem
                if progress is not None:
                    progress.sample(record)

    async def run_throughput_wave(arm: str, w: int, position: int) -> None:
        """A wave's problems at once on one reasoner; its wall time is the measurement."""
        wave, ids = waves[w], {p.index for p in waves[w]}
        before = recorded_wave(arm, w)  # what an earlier session left of this wave, read before the reset below
        entry = throughput_runs.get(arm)
        if entry is None or "waves" not in entry:  # new, or timed by a version without waves
            entry = throughput_runs[arm] = {"num_problems": len(problems), "max_concurrency": wave_size,
                                            "waves": []}
        entry["waves"] = entry["waves"][:w]  # later waves never ran before this one
        stale = [r for i, r in done_tp[arm].items() if i in ids]
        if stale or before:
            name = "" if len(waves) == 1 else f" (wave {w + 1} of {len(waves)})"
            logger.warning("throughput arm %s%s is incomplete (%d of %d problems saved, status %s): discarding its "
                           "samples and running it again as a whole", arm, name, len(stale), len(wave),
                           before.get("status", "none"))
        for i in ids:
            done_tp[arm].pop(i, None)
        write_jsonl(samples_file(arm, "throughput"), done_tp[arm].values())
        entry["num_solved"] = len(done_tp[arm])
        reasoner = spec.reasoners(arm_engines, (arm,), max_concurrency=len(wave))[arm]
        if reasoner.governor is not None:  # what it measured in the earlier waves, as a server keeps it
            if arm not in governors:  # a later session: the last wave's governor, restored
                last = next((r["governor"] for r in reversed(entry["waves"]) if "governor" in r), None)
                governors[arm] = reasoner.governor if last is None else GoodputGovernor.restore(last)
            reasoner.governor = governors[arm]
        await reasoner.asolve("What is 2 + 3?")  # first-call costs off the clock
        record = {"problems": sorted(ids), "status": "running", "num_solved": 0, "wall_seconds": None,
                  "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "session": session_index}  # wall times compare within one session
        entry["waves"].append(record)
        entry["status"] = "running"
        save("running")
        await reset_caches()

        async def one(problem: Problem) -> None:
            try:
                trace = (await reasoner.asolve(problem.question)).trace
            except ReasoningError as e:
                trace = e.trace
            sample = sample_record(problem, arm, position, trace, grader, mode="throughput",
                                   session=session_index)
            append(sample, "throughput")
            done_tp[arm][problem.index] = sample
            record["num_solved"] += 1
            entry["num_solved"] = len(done_tp[arm])
            session["num_solved"] += 1
            save("running")
            if progress is not None:
                progress.sample(sample)

        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(one(p)) for p in wave]
        try:
            await asyncio.gather(*tasks)
        except BaseException as e:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            entry["status"] = record["status"] = ("interrupted" if isinstance(e, (KeyboardInterrupt,
                                                                                   asyncio.CancelledError))
                                                  else "failed")
            raise
        finally:
            record["wall_seconds"] = time.perf_counter() - t0
            session["throughput_seconds"] += record["wall_seconds"]
        record["status"] = "complete"
        if reasoner.governor is not None:
            record["governor"] = reasoner.governor.snapshot()  # after this wave (it keeps the earlier ones')
        entry["status"] = "complete" if complete_arm(arm) else "incomplete"  # waves to go
        if entry["status"] == "complete":
            entry["wall_seconds"] = sum(r["wall_seconds"] for r in entry["waves"])
        save("running")

    async def run_throughput() -> None:
        """Wave by wave, every arm in a rotating order (one wave: each arm in turn)."""
        if progress is not None:
            progress.start(tuple(progress_key(s, "throughput") for s in throughput_arms), len(problems),
                           {progress_key(s, "throughput"): [done_tp[s][p.index] for w, wave in enumerate(waves)
                                                            if complete_wave(s, w) for p in wave]
                            for s in throughput_arms}, grader.metrics[0])
        for w in range(len(waves)):
            k = w % len(throughput_arms)
            for position, arm in enumerate(throughput_arms[k:] + throughput_arms[:k]):
                if complete_wave(arm, w):
                    logger.info("throughput arm %s, wave %d of %d: complete, skipped", arm, w + 1, len(waves))
                    continue
                await run_throughput_wave(arm, w, position)

    t_run = time.perf_counter()
    try:
        t0 = time.perf_counter()
        for engine in built.values():
            await engine.start()
        session["startup_seconds"] = time.perf_counter() - t0
        # What each engine computes in and why (dtype "auto": measured on this machine)
        session["engines"] = {role: dataclasses.asdict(e.info) for role, e in resettable.items()}
        # First-call costs (compilation, the embedder's load) off the clock: one small solve each.
        for reasoner in latency_reasoners.values():
            await reasoner.asolve("What is 2 + 3?")
        for mode in spec.modes:
            if mode == "latency" and latency_todo:
                await run_latency()
            elif mode == "throughput" and throughput_todo:
                await run_throughput()
        left = [m for m in spec.modes if m not in session_modes and todo[m]]
        status = "incomplete" if left else "complete"
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
