"""A bench run's files as typed data, declared once: the bench writes them with these models
and the report reads them back through the same ones, by attribute.

* :class:`Results`: the results file (``results_*.json``): the run's config, status, what it
  ran (:class:`RunInfo`: problems, arms, sessions, throughput waves) and both modes'
  summaries per arm (:class:`ArmSummary`, computed by :mod:`stepspec.workflows.eval.summary`).
* :class:`Sample`: one line of a samples file: one problem solved by one arm, its grade,
  seconds and trace (an :class:`stepspec.orchestrator.trace.Trace`).

Every file carries the :data:`SCHEMA_VERSION` it was written in (the results file once,
a samples file on each line); the one reader, :mod:`stepspec.workflows.eval.rundir`, reads only this
version and names ``stepspec bench migrate`` (:mod:`stepspec.workflows.eval.migrate`) for a file of
an older one. A key no field declares is kept
(``extra="allow"``) and written back on the next save, so resuming a run loses nothing.
A field that is None says the run did not record it (example: ``SampleStats.draft_seconds``
of a run written before steps were timed per author).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from stepspec.common.counts import summed
from stepspec.common.states import Author, RunStatus
from stepspec.orchestrator.trace import StepRecord, Trace

# The version of the results and samples files this code writes and reads. Raise it with a
# change a file of the old version does not read as (and its step in stepspec.workflows.eval.migrate).
SCHEMA_VERSION = 1


def check_schema(record: Any, where: str, migrate: str, error: type[Exception]) -> None:
    """``record`` (a file's content, or a line's) is of :data:`SCHEMA_VERSION`; else ``error``
    naming ``where`` and the fix: ``migrate`` (the command that brings an older one here), or
    for a newer one, a newer stepspec."""
    version = record.get("schema_version") if isinstance(record, dict) else None
    if version == SCHEMA_VERSION:
        return
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise error(f"{where}: written in results schema {version}, newer than this stepspec's "
                    f"({SCHEMA_VERSION}); upgrade stepspec to read it")
    found = "has no schema_version (written before files had one)" if version is None else \
        f"is in results schema {version!r}"
    raise error(f"{where} {found}; this stepspec reads schema {SCHEMA_VERSION}: {migrate}")


class Record(BaseModel):
    """A part of a run's files: unknown keys kept, fields assignable as the run goes."""

    model_config = ConfigDict(extra="allow")


# ----------------------------------------------------------------------------- samples


class SampleStats(Record):
    """A trace's counters as :meth:`Trace.stats` wrote them; None where the run did not record one."""

    stop_reason: str | None = None
    seconds: float = 0.0
    model_seconds: float = 0.0
    num_steps: int = 0
    num_drafted_steps: int = 0
    num_accepted_steps: int = 0
    num_cut_steps: int | None = None
    num_kept_draft_tokens: int | None = None
    num_backoff_steps: int | None = None
    judge_seconds: float = 0.0
    draft_seconds: float | None = None
    target_seconds: float | None = None
    num_tokens: int = 0
    num_draft_tokens: int = 0
    num_target_tokens: int = 0
    num_generated_tokens: dict[str, int] = Field(default_factory=dict)
    num_target_calls: int = 0
    num_judge_calls: int = 0
    spec_decoding: dict[str, dict[str, Any]] = Field(default_factory=dict)


class AgentTurn(Record):
    """One model request of an agent task, as its client saw it."""

    prompt_tokens: int  # the conversation so far, with the tools, as the served model reads it
    seconds: float  # the request's round trip
    finish_reason: str | None = None  # "tool_calls": the turn asked for tools
    tool_calls: list[str] = Field(default_factory=list)  # the names of the tools it called
    # its trace's step holding the calls (Trace.tool_call_steps: steps, drafted, kept, cut, tokens)
    tool_call_steps: dict[str, int] = Field(default_factory=dict)


class AgentRun(Record):
    """An agent task's loop: its turns, its tools' time, and each engine's prompt tokens over
    the task (``prompt_tokens[role]``: {"prompt": read, "cached": of those, from the prefix
    cache}; one task at a time only: with tasks in flight together an engine's counts mix)."""

    turns: list[AgentTurn] = Field(default_factory=list)
    tool_seconds: float = 0.0
    prompt_tokens: dict[str, dict[str, int]] = Field(default_factory=dict)

    @property
    def num_tool_calls(self) -> int:
        return sum(len(t.tool_calls) for t in self.turns)

    def tool_call_steps(self) -> dict[str, int]:
        """The turns' tool-call steps summed (each turn's trace ends at its call)."""
        return summed(t.tool_call_steps for t in self.turns)


class Sample(Record):
    """One problem solved by one arm (``strategy``: the arm's label), as its samples line holds it.
    ``position``: latency, its order among the arms on that problem; throughput, the arm's turn.
    ``session``: the run's session that solved it (seconds compare within one session)."""

    schema_version: int = SCHEMA_VERSION
    doc_id: int
    strategy: str
    mode: str = "latency"
    position: int | None = None
    session: int | None = None
    question: str = ""
    reference: Any = None
    gold: Any = None
    response: str = ""
    answer: Any = None
    extracted: dict[str, Any] = Field(default_factory=dict)
    correct: dict[str, bool]
    seconds: float
    model_seconds: float = 0.0
    stop_reason: str | None = None
    error: str | None = None
    stats: SampleStats
    trace: Trace  # an agent task's: the steps of all its turns, in order
    agent: AgentRun | None = None  # an agent task's loop (agent workloads)

    @field_validator("trace", mode="before")
    @classmethod
    def _trace(cls, value: Any) -> Any:
        return Trace.from_dict(value) if isinstance(value, dict) else value

    @field_serializer("trace")
    def _trace_json(self, trace: Trace) -> dict[str, Any]:
        return json.loads(trace.to_json())

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        return self.trace.steps

    def is_correct(self, metric: str) -> bool:
        return bool(self.correct[metric])

    def line(self) -> dict[str, Any]:
        """The samples file's line."""
        return self.model_dump(mode="json")


# ----------------------------------------------------------------------------- the run


class Hardware(Record):
    cpu_count: int | None = None
    machine: str | None = None
    cpu: str | None = None
    bf16_flags: list[str] = Field(default_factory=list)
    gpu: str | None = None


class Session(Record):
    """One process's work on a run: when, which modes, its time accounting (the latency loop's
    wall time and within it the solves, their model calls and the prefix-cache resets; the
    throughput waves'), where it ran and on which engines."""

    started: str
    modes: list[str] | None = None
    startup_seconds: float | None = None
    seconds: float | None = None
    num_solved: int = 0
    loop_seconds: float = 0.0
    solve_seconds: float = 0.0
    model_seconds: float = 0.0
    reset_seconds: float = 0.0
    throughput_seconds: float = 0.0
    versions: dict[str, Any] = Field(default_factory=dict)
    git_hash: str | None = None
    hardware: Hardware = Field(default_factory=Hardware)
    max_num_seqs: int | None = None
    prefix_cache_reset: dict[str, bool] = Field(default_factory=dict)
    engines: dict[str, dict[str, Any]] | None = None
    routers: dict[str, dict[str, Any]] | None = None
    max_rss_mib: float | None = None
    error: str | None = None


class Wave(Record):
    """A throughput arm's wave: its problems solved at once, timed as a unit; ``session``:
    which session timed it (wall times compare within one); ``governor``: the goodput
    governor after it (the next wave, in a later session too, starts from it)."""

    status: RunStatus
    problems: list[int] = Field(default_factory=list)
    num_solved: int | None = 0
    wall_seconds: float | None = None
    started: str | None = None
    session: int | None = None
    governor: dict[str, Any] | None = None


class ThroughputArm(Record):
    """An arm's throughput measurement: its waves, and the sum of their wall times once all ran."""

    status: RunStatus | None = None
    num_problems: int | None = None
    num_solved: int | None = None
    max_concurrency: int | None = None
    wall_seconds: float | None = None
    waves: list[Wave] = Field(default_factory=list)


class ArmInfo(Record):
    """What an arm ran: its strategy, judge (or router), the options given, and the target's
    token-level speculation (None: the arm never asks the target)."""

    strategy: str | None = None
    judge: str | None = None
    router: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    target_spec: str | None = None


class RunInfo(Record):
    """What a run is running: the problems, the arms and their samples files, the sessions
    that worked on it, and each throughput arm's waves."""

    created: str | None = None
    sessions: list[Session] = Field(default_factory=list)
    dataset_source: str = ""
    grader: str = ""
    metrics: list[str] = Field(default_factory=list)
    problem_ids: list[int] = Field(default_factory=list)
    latency_problem_ids: list[int] | None = None
    skipped_lines: list[list[Any]] = Field(default_factory=list)
    samples: dict[str, str] = Field(default_factory=dict)
    throughput_samples: dict[str, str] = Field(default_factory=dict)
    modes: list[str] = Field(default_factory=lambda: ["latency"])
    arms: dict[str, ArmInfo] = Field(default_factory=dict)
    throughput: dict[str, ThroughputArm] = Field(default_factory=dict)

    @property
    def latency_ids(self) -> list[int]:
        return self.problem_ids if self.latency_problem_ids is None else self.latency_problem_ids

    def waves(self, arm: str | None) -> list[Wave]:
        """An arm's throughput waves as timed, in the run's wave order."""
        entry = self.throughput.get(arm) if arm is not None else None
        return [] if entry is None else entry.waves


class RunConfig(Record):
    """The run's :class:`~stepspec.workflows.eval.bench.BenchSettings` as saved (what the report reads of it;
    every other setting is kept as saved)."""

    dataset: str = ""
    strategies: list[str] = Field(default_factory=list)
    strategy_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    offset: int = 0
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    throughput_wave: int | None = None
    max_tokens: int | None = None
    max_step_tokens: int | None = None
    max_steps: int | None = None
    target: str | None = None
    draft: str | None = None
    target_url: str | None = None
    draft_url: str | None = None
    target_spec: str | None = None
    draft_spec: str | None = None

    def url(self, role: Author) -> str | None:
        return self.target_url if role == Author.TARGET else self.draft_url

    def model(self, role: Author) -> str | None:
        return self.target if role == Author.TARGET else self.draft

    def spec(self, role: Author) -> str | None:
        return self.target_spec if role == Author.TARGET else self.draft_spec


class Overhead(Record):
    """What stepspec itself cost around the model calls over the run's problem loops:
    ``run_share`` = (loop wall time − model calls − cache resets) / loop wall time (this
    includes grading and writing samples); ``solve_share`` = the same within the solves."""

    loop_seconds: float = 0.0
    model_seconds: float = 0.0
    reset_seconds: float = 0.0
    run_share: float | None = None
    solve_share: float | None = None

    @classmethod
    def of(cls, sessions: list[Session]) -> "Overhead":
        loop = sum(s.loop_seconds for s in sessions)
        solve = sum(s.solve_seconds for s in sessions)
        model = sum(s.model_seconds for s in sessions)
        reset = sum(s.reset_seconds for s in sessions)
        return cls(loop_seconds=loop, model_seconds=model, reset_seconds=reset,
                   run_share=(loop - model - reset) / loop if loop else None,
                   solve_share=(solve - model) / solve if solve else None)


# ----------------------------------------------------------------------------- summaries


class Summary(BaseModel):
    """A computed figure (:mod:`stepspec.workflows.eval.summary` defines each); recomputed from the
    samples whenever a report is written, so only the current declaration is ever read."""

    model_config = ConfigDict(frozen=True)


class Paired(Summary):
    """An arm's correctness against the arm it is compared with (``over``) on the problems both
    solved: ``lost`` (that arm right, this one wrong), ``gained`` (the reverse), ``net`` = lost − gained."""

    metric: str
    num_problems: int
    lost: int
    gained: int
    net: int
    accuracy: float | None
    baseline_accuracy: float | None
    over: str | None = None


class Speedup(Summary):
    median: float | None = None
    geomean: float | None = None
    num_problems: int = 0
    over: str | None = None


class TokenLevel(Summary):
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float | None
    mean_acceptance_length: float


class Profile(Summary):
    """Where an arm's time went, per phase (:data:`stepspec.workflows.eval.summary.PHASES`)."""

    wall_seconds: float
    seconds: dict[str, float]
    share: dict[str, float | None]
    tokens: dict[str, int]
    tokens_per_second: dict[str, float | None]
    num_wasted_draft_tokens: int


class ThroughputFigures(Summary):
    status: RunStatus | None = None
    wall_seconds: float | None = None
    num_problems: int | None = None
    num_solved: int | None = None
    max_concurrency: int | None = None
    num_waves: int = 1
    paired_waves: int = 0
    problems_per_minute: float | None = None
    output_tokens_per_second: float | None = None
    speedup: float | None = None
    over: str | None = None
    other_session: bool = False


class Ceiling(Summary):
    arm: str
    speedup: float
    share: float | None


class VsScore(Summary):
    over: str
    ratio: float


class ArmSummary(Summary):
    """One arm's figures in one mode (the terms: :mod:`stepspec.workflows.eval.summary`)."""

    model_config = ConfigDict(frozen=False)  # the run's summary adds the mode's own figures

    num_problems: int
    num_errors: int
    accuracy: dict[str, float | None]
    accuracy_stderr: dict[str, float | None]
    seconds_p50: float | None
    seconds_p90: float | None
    seconds_total: float
    output_tokens_per_second: float | None
    speedup: Speedup
    step_acceptance_rate: float | None
    target_token_share: float | None
    num_tokens_mean: float | None
    num_generated_tokens: dict[str, int]
    num_target_calls_mean: float | None
    num_judge_calls_mean: float | None
    token_level: dict[str, TokenLevel]
    orchestration_share: float | None
    stop_reasons: dict[str, int]
    paired: Paired | None
    num_drafted_steps: int
    num_cut_steps: int | None
    num_kept_draft_tokens: int | None
    num_backoff_steps: int | None
    judge_seconds: float
    judge_seconds_per_drafted_step: float | None
    profile: Profile
    judge_seconds_vs_score: VsScore | None = None
    left_out: list[int] = Field(default_factory=list)  # latency: solved here, not yet by every arm
    throughput: ThroughputFigures | None = None  # throughput mode's wall-time figures
    ceiling: Ceiling | None = None


class Results(Record):
    """A results file: the run's config and status, what it ran, and both modes' summaries."""

    schema_version: int = SCHEMA_VERSION
    config: RunConfig
    status: RunStatus
    baseline: str | None = None
    # Both modes' summaries: written for people and other tools, never read back: reading a file
    # leaves them None until :func:`stepspec.workflows.eval.summary.recompute` computes them from the samples.
    results: dict[str, ArmSummary] | None = None  # latency mode
    results_throughput: dict[str, ArmSummary] | None = None
    overhead: Overhead | None = None
    run: RunInfo
    versions: dict[str, Any] = Field(default_factory=dict)
    git_hash: str | None = None

    @field_validator("results", "results_throughput", mode="before")
    @classmethod
    def _computed(cls, value: Any) -> Any:
        return value if isinstance(value, dict) and all(isinstance(m, ArmSummary) for m in value.values()) else None

    @property
    def metrics(self) -> list[str]:
        return self.run.metrics

    @property
    def primary(self) -> str:
        return self.run.metrics[0]

    def summary(self, mode: str) -> dict[str, ArmSummary]:
        return (self.results if mode == "latency" else self.results_throughput) or {}

    def file(self) -> dict[str, Any]:
        """The file's content."""
        return self.model_dump(mode="json")
