"""Running a :class:`~stepspec.workflows.eval.bench.BenchSettings`: :func:`run_bench` and the session
that does the work (:class:`BenchRun`), the samples and results files written as each
problem finishes (the modes, waves and files: :mod:`stepspec.workflows.eval.bench`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import resource
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from stepspec.common.files import append_jsonl, atomic_write_json, write_jsonl
from stepspec.common.states import Author
from stepspec.engine.config import OpenAIEngineConfig, build_engines, check_engine
from stepspec.engine.protocol import Engine
from stepspec.orchestrator.goodput import GoodputGovernor
from stepspec.orchestrator.reasoner import Reasoner
from stepspec.orchestrator.run import ReasoningError
from stepspec.orchestrator.trace import Trace
from stepspec.workflows.eval.bench import BASELINE, BenchSettings, Mode
from stepspec.workflows.eval.agent_tasks import TASK_SETS
from stepspec.workflows.eval.datasets import Problem, load_dataset, select
from stepspec.workflows.eval.graders import Grader, get_grader
from stepspec.workflows.eval.report import write_report
from stepspec.workflows.eval.results import (AgentRun, ArmInfo, Hardware, Overhead, Results, RunInfo, RunStatus, Sample,
                                    Session, ThroughputArm, Wave)
from stepspec.workflows.eval.summary import summarize_run
from stepspec.workflows.eval.rundir import (BenchError, RunFiles, find_results, git_hash, hardware, read_results,
                                   read_samples, versions)

logger = logging.getLogger(__name__)


class BenchProgress(Protocol):
    """What a run tells whoever shows its progress (the CLI's live bar). ``start`` comes
    once per mode, with the keys (``progress_key``) of that mode's arms."""

    def start(self, strategies: tuple[str, ...], num_problems: int, done: dict[str, list[Sample]],
              metric: str) -> None: ...

    def sample(self, record: Sample) -> None: ...


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


def arm_info(spec: BenchSettings, label: str, reasoner: Reasoner) -> ArmInfo:
    """What an arm runs: its strategy, judge (or router), the options given, and the target's
    token-level speculation (its strategy's own with target_spec auto; None: it never asks the target)."""
    options = {k: v for k, v in spec.strategy_options.get(label, {}).items() if k != "strategy"}
    judge = reasoner.judge
    target = spec.arm_config(label).target if reasoner.strategy.needs_target else None
    return ArmInfo(strategy=spec.strategy_of(label), judge=None if judge is None else judge.name,
                   router=None if reasoner.router is None else reasoner.router.name, options=options,
                   target_spec=None if target is None else getattr(target, "speculation", None) or "none")


class Solver(Protocol):
    """How a workload's problem is solved by an arm's reasoner: a data set's question is one
    trace (:func:`solve_question`); an agent task (:mod:`stepspec.workflows.eval.agent_tasks`) is a
    loop of model requests and tool calls (``stepspec.workflows.serve.agent_workload``), its trace
    the steps of all its turns."""

    async def __call__(self, reasoner: Reasoner, problem: Problem) -> tuple[Trace, AgentRun | None]: ...


async def solve_question(reasoner: Reasoner, problem: Problem) -> tuple[Trace, None]:
    """The problem's trace; where an engine failed mid-trace, the partial trace is the sample."""
    try:
        return (await reasoner.asolve(problem.question)).trace, None
    except ReasoningError as e:
        return e.trace, None


def sample_record(problem: Problem, strategy: str, position: int, trace: Trace, grader: Grader,
                  mode: str = "latency", *, session: int, agent: AgentRun | None = None) -> Sample:
    """One problem solved by one arm (``strategy``: its label), as its samples line holds it;
    ``session``: the run's session that solved it (its index in the results file's sessions)."""
    response = trace.text
    grades = grader.grade(response, problem.reference)
    stats = trace.stats()
    if agent is not None:  # a chained trace ends at its answer: its turns' calls are the agent's
        stats["tool_call_steps"] = agent.tool_call_steps()
    primary = grader.metrics[0]
    return Sample(doc_id=problem.index, strategy=strategy, mode=mode, position=position, session=session,
                  question=problem.question, reference=problem.reference, gold=grader.gold(problem.reference),
                  response=response, answer=grades[primary].extracted,
                  extracted={m: g.extracted for m, g in grades.items()},
                  correct={m: g.correct for m, g in grades.items()}, seconds=trace.seconds,
                  model_seconds=trace.model_seconds, stop_reason=trace.stop_reason, error=trace.error,
                  stats=stats, trace=trace, agent=agent)


def _config_as_run(saved: Results) -> dict[str, Any]:
    """A saved run's config, as it ran: a run from before engines took a dtype computed in
    float32 on a CPU (what ``auto`` meant then), so a resume keeps it so, not ``auto``'s choice now."""
    on_gpu = any(s.hardware.gpu for s in saved.run.sessions)
    return {**{key: "float32" for key in ("target_dtype", "draft_dtype") if not on_gpu},
            **saved.config.model_dump(mode="json", exclude_unset=True)}


def saved_spec(run_dir: str | os.PathLike) -> BenchSettings | None:
    """The settings the run in ``run_dir`` was started with, as a resume runs them (None: the
    folder holds no run)."""
    run_dir = Path(run_dir)
    if not any(run_dir.glob("results_*.json")):
        return None
    saved = read_results(run_dir)
    try:
        return BenchSettings.model_validate(_config_as_run(saved))
    except ValidationError as e:
        raise BenchError(f"{find_results(run_dir)}: its config cannot be read back ({e})") from e


async def run_bench(spec: BenchSettings, run_dir: str | os.PathLike, *, resume: bool = False,
                    engines: tuple[Engine, Engine | None] | None = None,
                    progress: BenchProgress | None = None, modes: tuple[Mode, ...] | None = None,
                    agent_solver: Solver | None = None) -> Results:
    """Run (or resume) a benchmark into ``run_dir``; returns its results file.

    ``engines``: (target, draft) to use instead of building vLLM engines from the
    spec (tests pass scripted engines). ``progress`` hears of each record as it is saved.
    ``modes``: run only these of the run's modes in this session (default: all of them);
    the others wait for a later resume, and the run is saved as ``incomplete``. Example:
    a run of both modes whose throughput waves outlast the time at hand resumes with
    ``modes=("latency",)`` to spend it on latency problems, each timed on its own.
    ``agent_solver``: how an agent workload's task is solved (its agent loop,
    ``stepspec.workflows.serve.agent_workload.solve_agent_task``); a data set's question is one trace.
    """
    run = BenchRun(spec, Path(run_dir), resume=resume, engines=engines, progress=progress, modes=modes,
                   agent_solver=agent_solver)
    if not any(run.todo.values()):  # nothing left: the results and report rewritten
        run.run_dir.mkdir(parents=True, exist_ok=True)
        results = run.save(RunStatus.COMPLETE)
        write_report(run.run_dir)
        return results
    return await run.execute()


class BenchRun:
    """One session of a run: what its files hold (problems solved per arm and mode, waves
    timed), what is left, and the loops that solve it; every result saved as it comes.

    ``done[mode][arm]``: the samples saved, by problem index. ``waves``: the throughput
    problems in waves; ``throughput[arm].waves[w]``: what the results file says of
    wave ``w`` (its problems, status, wall time, session, the governor after it).
    """

    def __init__(self, spec: BenchSettings, run_dir: Path, *, resume: bool,
                 engines: tuple[Engine, Engine | None] | None, progress: BenchProgress | None,
                 modes: tuple[Mode, ...] | None, agent_solver: Solver | None = None) -> None:
        self.run_dir, self.given, self.progress = run_dir, engines, progress
        self.files, saved, self.spec = _open_run(spec, run_dir, resume)
        # Everything that can be wrong with the spec fails here, before a model is prepared.
        self.checked = self.spec.check()
        spec = self.spec
        self.session_modes = spec.modes if modes is None else modes
        if not set(self.session_modes) <= set(spec.modes) or not self.session_modes:
            raise BenchError(f"{run_dir}: this session's modes {', '.join(self.session_modes) or '(none)'} are not "
                             f"among the run's ({', '.join(spec.modes)}); name one of those, or none for all")
        dataset = load_dataset(spec.dataset, spec.data_dir, source=spec.source, question_field=spec.question_field,
                               answer_field=spec.answer_field, grader=spec.grader,
                               skip_bad_lines=spec.skip_bad_lines)
        self.dataset_name = dataset.name
        if dataset.name in TASK_SETS and agent_solver is None:
            raise BenchError(f"'{dataset.name}' is an agent workload: an agent loop solves each task through the "
                             "serve app; run it with `stepspec bench`, or pass run_bench(..., agent_solver="
                             "stepspec.workflows.serve.agent_workload.solve_agent_task)")
        self.solve: Solver = agent_solver if dataset.name in TASK_SETS else solve_question
        self.problems = select(dataset.problems, offset=spec.offset, limit=spec.limit, sample=spec.sample,
                               seed=spec.seed)
        self.grader = get_grader(dataset.grader)
        for p in self.problems:
            self.grader.gold(p.reference)  # a reference the grader cannot read fails now, not mid-run
        for config in spec.arm_engines()[0].values() if engines is None else ():
            check_engine(config)  # an unknown model, before any is prepared and before the run has files
        self.arms = {"latency": spec.latency_arms(), "throughput": spec.throughput_arms()}
        self.latency_problems = self.problems[:spec.latency_limit] if spec.latency_limit else self.problems
        self.done = {mode: {s: {r.doc_id: r for r in read_samples(self.samples_file(s, mode), repair=True)}
                            for s in arms} for mode, arms in self.arms.items()}
        self.run_info = self._run_info(saved, dataset)
        self.throughput = self.run_info.throughput
        self.wave_size = spec.throughput_wave or len(self.problems)
        self.waves = [self.problems[i:i + self.wave_size] for i in range(0, len(self.problems), self.wave_size)]
        # Time accounting of this session: the latency loop's wall time, and within it the
        # solves, their model calls and the prefix-cache resets (engine calls too); the
        # throughput arms' wall time.
        self.session = Session(started=_now(), modes=list(self.session_modes), versions=versions(),
                               git_hash=git_hash(), hardware=Hardware(**hardware()))
        self.todo = {"latency": [(p, s) for p in self.latency_problems for s in self.arms["latency"]
                                 if p.index not in self.done["latency"][s]],
                     "throughput": [s for s in self.arms["throughput"] if not self.complete_arm(s)]}
        self.governors: dict[str, GoodputGovernor] = {}

    def _run_info(self, saved: Results | None, dataset: Any) -> RunInfo:
        arms = self.arms
        return (RunInfo(created=_now()) if saved is None else saved.run).model_copy(update=dict(
            dataset_source=dataset.source, grader=self.grader.name, metrics=list(self.grader.metrics),
            problem_ids=[p.index for p in self.problems], skipped_lines=[list(s) for s in dataset.skipped],
            samples={s: self.samples_file(s, "latency").name for s in arms["latency"]},
            modes=list(self.spec.modes), latency_problem_ids=[p.index for p in self.latency_problems],
            throughput_samples={s: self.samples_file(s, "throughput").name for s in arms["throughput"]},
            arms={s: arm_info(self.spec, s, self.checked[s]) for s in self.spec.strategies}))

    def samples_file(self, arm: str, mode: str) -> Path:
        return self.files.samples(self.dataset_name, arm, mode)

    def recorded_wave(self, arm: str, w: int) -> Wave | None:
        """What the results file says of an arm's wave."""
        recorded = self.run_info.waves(arm)
        return recorded[w] if w < len(recorded) else None

    def complete_wave(self, arm: str, w: int) -> bool:
        wave = self.recorded_wave(arm, w)
        return (wave is not None and wave.status == RunStatus.COMPLETE
                and all(p.index in self.done["throughput"][arm] for p in self.waves[w]))

    def complete_arm(self, arm: str) -> bool:
        return all(self.complete_wave(arm, w) for w in range(len(self.waves)))

    def save(self, status: RunStatus) -> Results:
        """The results file, rewritten whole (never half-written) from the samples so far."""
        spec, done = self.spec, self.done
        results = Results(config=spec.model_dump(mode="json"), status=status, run=self.run_info,
                          baseline=BASELINE if BASELINE in spec.strategies else None,
                          overhead=Overhead.of(self.run_info.sessions), versions=self.session.versions,
                          git_hash=self.session.git_hash)
        latency = {s: [done["latency"][s][p.index] for p in self.latency_problems if p.index in done["latency"][s]]
                   for s in self.arms["latency"]}
        throughput = {s: [done["throughput"][s][p.index] for p in self.problems if p.index in done["throughput"][s]]
                      for s in self.arms["throughput"]}
        results.results, results.results_throughput = summarize_run(results, latency, throughput)
        atomic_write_json(self.files.results, results.file())
        return results

    def _record(self, record: Sample, mode: str) -> None:
        """A solved problem: appended to its samples file, counted, the results file rewritten."""
        append_jsonl(self.samples_file(record.strategy, mode), record.line())
        self.done[mode][record.strategy][record.doc_id] = record
        self.session.num_solved += 1

    def _build_engines(self) -> list[Engine]:
        """This session's engines (built, not loaded) and each arm's (target, draft); returns those it owns."""
        spec, session = self.spec, self.session
        # Throughput mode serves a wave's problems at once: each in-process engine must batch that
        # many sequences (a server batches as it was started).
        max_num_seqs = max(spec.max_num_seqs, self.wave_size) if self.throughput_todo else spec.max_num_seqs
        configs, roles = spec.model_copy(update={"max_num_seqs": max_num_seqs}).arm_engines()
        servers = [role for role, c in configs.items() if isinstance(c, OpenAIEngineConfig)]
        if max_num_seqs != spec.max_num_seqs:
            logger.info("throughput mode: max_num_seqs raised from %d to %d (the problems at once)%s",
                        spec.max_num_seqs, max_num_seqs, f"; not for the {' and '.join(servers)} server, which "
                        "batches as it was started" if servers else "")
        session.max_num_seqs = max_num_seqs
        if self.given is None:
            built = build_engines(configs, names={role: c.model for role, c in configs.items()})
            owned = list(built.values())
        else:  # every arm on the engines given
            target, draft = self.given
            built, owned = {Author.TARGET: target, **({Author.DRAFT: draft} if draft is not None else {})}, []
            roles = {label: ("target", "draft" if draft is not None else None) for label in spec.strategies}
        # each arm's (target, draft); an arm that never asks the target (draft-only) holds any one
        any_target = next((e for role, e in built.items() if role.startswith("target")), None)
        self.arm_engines = {label: (built[t] if t else any_target, built[d] if d else None)
                            for label, (t, d) in roles.items()}
        # Every solve (latency) and every arm's wave (throughput) starts cold: both engines' prefix
        # caches and token-speculation caches are reset first; an engine that cannot (a server,
        # unless its backend offers it) is named in the session and the report.
        self.engines = built
        session.prefix_cache_reset = {role: hasattr(e, "reset_caches") for role, e in built.items()}
        for role, ok in session.prefix_cache_reset.items():
            if not ok:
                logger.warning("the %s engine (%s) cannot reset its caches: its prefix cache carries over between "
                               "solves, so later solves of a problem may be served from it; compare arms on "
                               "in-process engines for latency", role, built[role].name)
        return owned

    async def reset_caches(self) -> None:
        t_reset = time.perf_counter()
        for role, engine in self.engines.items():
            if self.session.prefix_cache_reset[role]:
                await engine.reset_caches()
        self.session.reset_seconds += time.perf_counter() - t_reset

    async def execute(self) -> Results:
        """This session's work: the engines started, each mode's loop, the results saved whatever happens."""
        spec, session = self.spec, self.session
        if not any(self.todo[m] for m in self.session_modes):
            raise BenchError(f"{self.run_dir}: the run's {' and '.join(self.session_modes)} mode is done; resume it "
                             f"without a mode to run the rest ({', '.join(m for m in spec.modes if self.todo[m])})")
        # this session's work; the other modes' wait for a later resume
        self.latency_todo, self.throughput_todo = (self.todo[m] if m in self.session_modes else []
                                                   for m in ("latency", "throughput"))
        self.run_info.sessions.append(session)  # a session that has work (a finished run's resume adds none)
        self.session_index = len(self.run_info.sessions) - 1  # what samples and waves name this session by
        owned = self._build_engines()
        # The engines are built (models resolved, not loaded yet): from here on the run has files.
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.save(RunStatus.RUNNING)
        # Latency arms with work left; a throughput arm gets its own reasoner, built fresh when
        # its turn comes, with the goodput governor of its earlier waves in this session.
        self.latency_reasoners = spec.reasoners(self.arm_engines, tuple(
            s for s in self.arms["latency"] if any(s == a for _, a in self.latency_todo)))
        session.routers = {s: router_info(r.router) for s, r in self.checked.items() if r.router is not None}
        t_run = time.perf_counter()
        try:
            await self._start_engines()
            for mode in spec.modes:
                if mode == "latency" and self.latency_todo:
                    await self.run_latency()
                elif mode == "throughput" and self.throughput_todo:
                    await self.run_throughput()
            left = [m for m in spec.modes if m not in self.session_modes and self.todo[m]]
            status = RunStatus.INCOMPLETE if left else RunStatus.COMPLETE
        except BaseException as e:
            status = _stopped(e)
            session.error = ("cancelled (Ctrl-C or SIGTERM)" if isinstance(e, asyncio.CancelledError)
                             else f"{type(e).__name__}: {e}")
            raise
        finally:
            session.seconds = time.perf_counter() - t_run
            # Peak memory of this process (orchestrator, vLLM clients, judges' models), not of
            # the engine worker processes.
            session.max_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            results = self.save(status)
            for engine in owned:
                await engine.close()
        write_report(self.run_dir)
        return results

    async def _start_engines(self) -> None:
        t0 = time.perf_counter()
        for engine in self.engines.values():
            await engine.start()
        self.session.startup_seconds = time.perf_counter() - t0
        # What each engine computes in and why (dtype "auto": measured on this machine)
        self.session.engines = {role: dataclasses.asdict(e.info) for role, e in self.engines.items()}
        # First-call costs (compilation, the embedder's load) off the clock: one small solve each.
        for reasoner in self.latency_reasoners.values():
            await reasoner.asolve(WARM_UP)

    async def run_latency(self) -> None:
        """Every latency problem, every latency arm in a rotating order, caches reset before each solve."""
        arms, done, session = self.arms["latency"], self.done["latency"], self.session
        if self.progress is not None:
            self.progress.start(arms, len(self.latency_problems),
                                {s: [done[s][p.index] for p in self.latency_problems if p.index in done[s]]
                                 for s in arms}, self.grader.metrics[0])
        t_loop = time.perf_counter()
        loop_before = session.loop_seconds
        for n, problem in enumerate(self.latency_problems):
            k = n % len(arms)
            for position, arm in enumerate(arms[k:] + arms[:k]):
                if problem.index in done[arm]:
                    continue
                await self.reset_caches()
                trace, agent = await self.solve(self.latency_reasoners[arm], problem)
                record = sample_record(problem, arm, position, trace, self.grader, mode="latency", agent=agent,
                                       session=self.session_index)
                self._record(record, "latency")
                session.solve_seconds += trace.seconds
                session.model_seconds += trace.model_seconds
                session.loop_seconds = loop_before + time.perf_counter() - t_loop
                self.save(RunStatus.RUNNING)  # the results file is current after every problem
                if self.progress is not None:
                    self.progress.sample(record)

    async def run_throughput(self) -> None:
        """Wave by wave, every arm in a rotating order (one wave: each arm in turn)."""
        arms, done = self.arms["throughput"], self.done["throughput"]
        if self.progress is not None:
            self.progress.start(tuple(progress_key(s, "throughput") for s in arms), len(self.problems),
                                {progress_key(s, "throughput"): [done[s][p.index] for w, wave in enumerate(self.waves)
                                                                 if self.complete_wave(s, w) for p in wave]
                                 for s in arms}, self.grader.metrics[0])
        for w in range(len(self.waves)):
            k = w % len(arms)
            for position, arm in enumerate(arms[k:] + arms[:k]):
                if self.complete_wave(arm, w):
                    logger.info("throughput arm %s, wave %d of %d: complete, skipped", arm, w + 1, len(self.waves))
                    continue
                await self.run_throughput_wave(arm, w, position)

    def _restart_wave(self, arm: str, w: int) -> ThroughputArm:
        """The arm's results entry with wave ``w`` (and any later one) dropped, with its samples: a
        wave is timed as a unit, so one an earlier session cut short runs again whole."""
        wave, ids, done = self.waves[w], {p.index for p in self.waves[w]}, self.done["throughput"][arm]
        before = self.recorded_wave(arm, w)  # what an earlier session left of this wave
        entry = self.throughput.get(arm)
        if entry is None:
            entry = self.throughput[arm] = ThroughputArm(num_problems=len(self.problems),
                                                         max_concurrency=self.wave_size, waves=[])
        entry.waves = entry.waves[:w]  # later waves never ran before this one
        stale = [r for i, r in done.items() if i in ids]
        if stale or before is not None:
            name = "" if len(self.waves) == 1 else f" (wave {w + 1} of {len(self.waves)})"
            logger.warning("throughput arm %s%s is incomplete (%d of %d problems saved, status %s): discarding its "
                           "samples and running it again as a whole", arm, name, len(stale), len(wave),
                           "none" if before is None else before.status)
        for i in ids:
            done.pop(i, None)
        write_jsonl(self.samples_file(arm, "throughput"), (r.line() for r in done.values()))
        entry.num_solved = len(done)
        return entry

    def _wave_reasoner(self, arm: str, entry: ThroughputArm, size: int) -> Reasoner:
        """A fresh reasoner for the arm's wave, with the governor of its earlier waves, as a server keeps it."""
        reasoner = self.spec.reasoners(self.arm_engines, (arm,), max_concurrency=size)[arm]
        if reasoner.governor is not None:
            if arm not in self.governors:  # a later session: the last wave's governor, restored
                last = next((r.governor for r in reversed(entry.waves) if r.governor is not None), None)
                self.governors[arm] = reasoner.governor if last is None else GoodputGovernor.restore(last)
            reasoner.governor = self.governors[arm]
        return reasoner

    async def run_throughput_wave(self, arm: str, w: int, position: int) -> None:
        """A wave's problems at once on one reasoner; its wall time is the measurement."""
        wave = self.waves[w]
        entry = self._restart_wave(arm, w)
        reasoner = self._wave_reasoner(arm, entry, len(wave))
        await reasoner.asolve(WARM_UP)  # first-call costs off the clock
        record = Wave(problems=sorted(p.index for p in wave), status=RunStatus.RUNNING, started=_now(),
                      session=self.session_index)  # wall times compare within one session
        entry.waves.append(record)
        entry.status = RunStatus.RUNNING
        self.save(RunStatus.RUNNING)
        await self.reset_caches()

        async def one(problem: Problem) -> None:
            trace, agent = await self.solve(reasoner, problem)
            sample = sample_record(problem, arm, position, trace, self.grader, mode="throughput", agent=agent,
                                   session=self.session_index)
            self._record(sample, "throughput")
            record.num_solved += 1
            entry.num_solved = len(self.done["throughput"][arm])
            self.save(RunStatus.RUNNING)
            if self.progress is not None:
                self.progress.sample(sample)

        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(one(p)) for p in wave]
        try:
            await asyncio.gather(*tasks)
        except BaseException as e:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            entry.status = record.status = _stopped(e)
            raise
        finally:
            record.wall_seconds = time.perf_counter() - t0
            self.session.throughput_seconds += record.wall_seconds
        record.status = RunStatus.COMPLETE
        if reasoner.governor is not None:
            record.governor = reasoner.governor.snapshot()  # after this wave (it keeps the earlier ones')
        entry.status = RunStatus.COMPLETE if self.complete_arm(arm) else RunStatus.INCOMPLETE  # waves to go
        if entry.status == RunStatus.COMPLETE:
            entry.wall_seconds = sum(r.wall_seconds for r in entry.waves)
        self.save(RunStatus.RUNNING)


def _stopped(e: BaseException) -> RunStatus:
    """How an exception leaves a run, an arm or a wave."""
    return RunStatus.INTERRUPTED if isinstance(e, (KeyboardInterrupt, asyncio.CancelledError)) else RunStatus.FAILED


WARM_UP = "What is 2 + 3?"  # a small solve that takes first-call costs off the clock


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _open_run(spec: BenchSettings, run_dir: Path, resume: bool) -> tuple[RunFiles, Results | None, BenchSettings]:
    """The run's files, what its results file holds (None: a new run), and its spec (a resumed
    run's: the saved one)."""
    if resume:
        files = RunFiles(run_dir, find_results(run_dir))
        return files, read_results(run_dir), saved_spec(run_dir)
    if run_dir.exists() and any(run_dir.glob("results_*.json")):
        raise BenchError(f"{run_dir} already holds a run; resume it with --resume {run_dir}, or pick "
                         "another --output-dir")
    stamp = datetime.now().strftime("%Y-%m-%dT%H-%M-%S")
    return RunFiles(run_dir, run_dir / f"results_{stamp}.json"), None, spec
