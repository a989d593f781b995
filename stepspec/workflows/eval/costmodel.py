"""A cost model of a run's traces: every engine call, its cost, and where step drafting pays.

Terms. A trace's work is a sequence of *engine calls*, each one of three *operations*:

* ``draft writes``: the draft model generates (a step, or a run of steps);
* ``target verifies``: the target prefills drafted tokens and reports their logprobs
  (one call per judged step);
* ``target writes``: the target generates (its own steps, a rewrite, a token at a cut).

A call *prefills* the tokens its engine has not computed yet (the opening prompt on an
engine's first call; then what the other model wrote since this engine last ran) and
*decodes* the tokens it generates. An operation's *cost* on an engine configuration (the
model, the machine, the token-level method inside) is linear in those counts::

    seconds = per_call + per_prefill_token * prefilled + per_decode_token * decoded

:func:`trace_usage` reconstructs each trace's calls from its step records and counters,
:func:`fit` finds the three coefficients of every (operation, token method) by least squares
(non-negative) over one run's traces, and :func:`predict` prices any run's traces with a
:class:`CostProfile`: one fitted on this machine, or one written from published figures for
other hardware (``cost_profiles.yaml`` beside this module, each figure with its source).

Worked example. specreason's step: the draft writes 40 tokens after the target wrote 10
(prefill 10, decode 40), the target verifies them (prefill 40) and cuts at token 30, then
writes one token at the cut (prefill 0: the kept 30 are cached from the verification;
decode 1). With draft (0.1 s, 0.002 s, 0.03 s), verify (0.25 s, 0.007 s, -) and target
write (0.25 s, 0.007 s, 0.16 s): 1.32 + 0.53 + 0.41 = 2.26 s for 31 kept tokens, three
calls: 0.097 calls per kept token. Target-only writes the same 31 tokens in part of one
call at 0.16 s a token: 4.96 s.

The model is of one problem at a time (batch 1); under load calls share forward passes and
the linear costs no longer add.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from stepspec.common.states import Author
from stepspec.orchestrator.trace import Trace

# Any token method: a published profile's cost holds for every method (it prices plain decoding).
ANY_METHOD = "any"
PROFILES_FILE = Path(__file__).with_name("cost_profiles.yaml")
# Characters per token of English and arithmetic text for the Qwen2.5 tokenizer, used to
# price an engine's first call (the opening prompt) where the trace keeps only the question.
CHARS_PER_TOKEN = 4.0


class CostModelError(ValueError):
    """A run or profile the cost model cannot price; the message names what is missing."""


class Op(StrEnum):
    """What an engine call does."""

    DRAFT_WRITE = "draft writes"
    VERIFY = "target verifies"
    TARGET_WRITE = "target writes"

    @property
    def role(self) -> Author:
        return Author.DRAFT if self is Op.DRAFT_WRITE else Author.TARGET


@dataclass(frozen=True)
class Usage:
    """One operation's calls in a trace: how many, the tokens they prefilled and decoded, and
    the seconds they took (as measured; 0 where the usage is a projection's input only)."""

    calls: int = 0
    prefill: int = 0
    decode: int = 0
    seconds: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.calls + other.calls, self.prefill + other.prefill, self.decode + other.decode,
                     self.seconds + other.seconds)


@dataclass(frozen=True)
class OpCost:
    """Seconds of an operation's call: a fixed part, and one per prefilled and per decoded token."""

    per_call: float
    per_prefill_token: float
    per_decode_token: float = 0.0

    def seconds(self, usage: Usage) -> float:
        return (self.per_call * usage.calls + self.per_prefill_token * usage.prefill
                + self.per_decode_token * usage.decode)


# An engine configuration's operation: (operation, token-level method inside that engine).
EngineOp = tuple[Op, str]


@dataclass(frozen=True)
class CostProfile:
    """The costs of each operation on one machine for one pair; ``source`` says where the
    figures come from (a fitted run, or the publications each figure is taken from)."""

    name: str
    costs: Mapping[EngineOp, OpCost]
    source: str = ""
    notes: str = ""

    def cost(self, key: EngineOp) -> OpCost:
        op, method = key
        for k in (key, (op, ANY_METHOD)):
            if k in self.costs:
                return self.costs[k]
        known = ", ".join(f"{o.value} ({m})" for o, m in self.costs) or "none"
        raise CostModelError(f"cost profile '{self.name}' has no cost for '{op.value}' with token method "
                             f"'{method}' (it has: {known}); fit it on a run that has such an arm, or price "
                             "that operation with a profile that does")


@dataclass(frozen=True)
class ArmMethods:
    """The token-level method inside each engine an arm used ('none' without one)."""

    target: str = "none"
    draft: str = "none"

    def of(self, role: Author) -> str:
        return self.target if role is Author.TARGET else self.draft


def opening_tokens(question: str) -> int:
    """An engine's first prefill, estimated from the question's characters."""
    return math.ceil(len(question) / CHARS_PER_TOKEN)


def trace_usage(trace: Trace, methods: ArmMethods) -> dict[EngineOp, Usage]:
    """Each operation's calls in ``trace``, reconstructed from its step records.

    Walking the records in order, each engine's *seen* position is how far into the trace its
    cache reaches: a drafted step moves the draft's to the step's end (or to the cut), a
    verification and a target write move the target's. A call prefills from its engine's seen
    position to the trace's current end (the opening prompt too, on the engine's first call).
    Calls and decoded tokens per engine are the trace's own counters (one generation may hold
    several records: a run of steps), seconds the records' sums."""
    seen: dict[Author, int | None] = {Author.DRAFT: None, Author.TARGET: None}
    opening = opening_tokens(trace.question)
    usage: dict[Op, Usage] = defaultdict(Usage)
    n = 0  # the trace's tokens so far

    def prefill(role: Author) -> int:
        done = seen[role]
        return opening + n if done is None else max(0, n - done)

    for s in trace.steps:
        drafted = s.draft_text is not None or s.author is Author.DRAFT
        kept = s.num_kept_tokens if s.cut else (s.num_draft_tokens if s.accepted or s.author is Author.DRAFT else 0)
        if drafted and (s.num_draft_tokens or s.draft_seconds):
            usage[Op.DRAFT_WRITE] += Usage(0, prefill(Author.DRAFT), 0, s.draft_seconds)
            seen[Author.DRAFT] = n + kept
        if s.draft_text is not None and s.judge_seconds > 0:
            usage[Op.VERIFY] += Usage(1, prefill(Author.TARGET) + s.num_draft_tokens, 0, s.judge_seconds)
            seen[Author.TARGET] = n + kept
        if s.author is Author.TARGET and (s.num_target_tokens or s.target_seconds):
            usage[Op.TARGET_WRITE] += Usage(0, prefill(Author.TARGET), 0, s.target_seconds)
            seen[Author.TARGET] = n + s.num_tokens
        n += s.num_tokens
    for op in (Op.DRAFT_WRITE, Op.TARGET_WRITE):
        role = op.role.value
        calls, decoded = trace.num_generate_calls.get(role, 0), trace.num_generated_tokens.get(role, 0)
        if calls or decoded or op in usage:
            usage[op] = Usage(calls, usage[op].prefill, decoded, usage[op].seconds)
    return {(op, methods.of(op.role)): u for op, u in usage.items()}


def calls_per_kept_token(usages: Iterable[Mapping[EngineOp, Usage]], kept_tokens: int) -> float | None:
    """Engine calls of every operation over the tokens of the final traces."""
    calls = sum(u.calls for usage in usages for u in usage.values())
    return calls / kept_tokens if kept_tokens else None


def _nonnegative_lstsq(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Least squares with every coefficient at least 0: solve, drop the negative ones, solve again."""
    import numpy as np

    a, b = np.asarray(rows, dtype=float), np.asarray(y, dtype=float)
    active = [j for j in range(a.shape[1]) if np.any(a[:, j])]
    while True:
        coef = np.zeros(a.shape[1])
        if active:
            coef[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
        negative = [j for j in active if coef[j] < 0]
        if not negative:
            return [float(c) for c in coef]
        active.remove(min(negative, key=lambda j: coef[j]))


def fit(usages: Iterable[Mapping[EngineOp, Usage]], name: str, source: str = "") -> CostProfile:
    """Each (operation, method)'s cost, fitted on the traces' measured usage: one least-squares
    row per trace and operation (calls, prefilled, decoded -> seconds), coefficients at least 0."""
    rows: dict[EngineOp, list[Usage]] = defaultdict(list)
    for usage in usages:
        for key, u in usage.items():
            if u.calls:
                rows[key].append(u)
    if not rows:
        raise CostModelError(f"no engine calls to fit '{name}' on: the run's traces record none")
    costs = {key: OpCost(*_nonnegative_lstsq([(u.calls, u.prefill, u.decode) for u in us],
                                             [u.seconds for u in us]))
             for key, us in rows.items()}
    return CostProfile(name, costs, source)


def predict(usage: Mapping[EngineOp, Usage], profile: CostProfile) -> float:
    """A trace's model seconds under ``profile``."""
    return sum(profile.cost(key).seconds(u) for key, u in usage.items())


def load_profiles(path: str | Path = PROFILES_FILE) -> list[CostProfile]:
    """The published cost profiles (``cost_profiles.yaml``): per profile a name, its sources and
    each operation's costs in seconds (any token method: they price plain decoding)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise CostModelError(f"{path}: cannot read the cost profiles ({e}); fix or restore the file") from e
    profiles = []
    for i, entry in enumerate((data or {}).get("profiles", [])):
        try:
            costs = {(Op(op), ANY_METHOD): OpCost(**cost) for op, cost in entry["costs"].items()}
            profiles.append(CostProfile(entry["name"], costs, entry["source"], entry.get("notes", "")))
        except (KeyError, TypeError, ValueError) as e:
            name = entry.get("name", "unnamed") if isinstance(entry, dict) else str(entry)
            raise CostModelError(f"{path}: profile {i + 1} ({name}) is malformed ({type(e).__name__}: {e}); each profile needs name, source and costs "
                                 f"of {', '.join(o.value for o in Op)} with per_call, per_prefill_token and "
                                 "per_decode_token") from e
    if not profiles:
        raise CostModelError(f"{path}: no profiles; the file lists them under 'profiles:'")
    return profiles


# ----------------------------------------------------------------------------- a run's arms


@dataclass(frozen=True)
class ArmUsage:
    """An arm's traces as the cost model sees them, with what was measured of each."""

    arm: str
    doc_ids: tuple[int, ...]
    usages: tuple[Mapping[EngineOp, Usage], ...]
    seconds: tuple[float, ...]  # measured wall seconds per trace
    kept_tokens: int
    correct: tuple[bool, ...] = field(default=())

    @property
    def measured(self) -> float:
        return sum(self.seconds)

    def predicted(self, profile: CostProfile) -> float:
        return sum(predict(u, profile) for u in self.usages)

    def per_problem(self, profile: CostProfile) -> dict[int, float]:
        return {d: predict(u, profile) for d, u in zip(self.doc_ids, self.usages)}

    @property
    def calls_per_kept_token(self) -> float | None:
        return calls_per_kept_token(self.usages, self.kept_tokens)

    def total(self) -> dict[EngineOp, Usage]:
        out: dict[EngineOp, Usage] = defaultdict(Usage)
        for usage in self.usages:
            for key, u in usage.items():
                out[key] += u
        return dict(out)


def run_usage(run_dir: str | Path, metric: str | None = None) -> tuple[Any, dict[str, ArmUsage]]:
    """A run's results and each latency arm's traces as usage (errored traces left out)."""
    from stepspec.workflows.eval.summary import load_run

    results, latency = load_run(run_dir)
    if not latency or not any(latency.values()):
        raise CostModelError(f"{run_dir}: no latency (one at a time) samples; the cost model prices one problem at "
                             "a time, so give a run with a latency mode")
    metric = metric or (results.run.metrics[0] if results.run.metrics else None)
    arms = {}
    for arm, samples in latency.items():
        info = results.run.arms.get(arm)
        methods = ArmMethods(target=(info.target_spec if info and info.target_spec else "none"),
                             draft=results.config.draft_spec or "none")
        ok = [s for s in samples if s.error is None]
        if not ok:
            continue
        arms[arm] = ArmUsage(arm, tuple(s.doc_id for s in ok), tuple(trace_usage(s.trace, methods) for s in ok),
                             tuple(s.seconds for s in ok), sum(s.stats.num_tokens for s in ok),
                             tuple(bool(metric and s.correct.get(metric)) for s in ok))
    return results, arms


def speedups(base: ArmUsage, arm: ArmUsage, profile: CostProfile | None = None) -> tuple[float, float]:
    """(pooled, median per problem) speedup of ``arm`` over ``base`` on their common problems:
    measured, or predicted under ``profile``."""
    def times(a: ArmUsage) -> dict[int, float]:
        return a.per_problem(profile) if profile else dict(zip(a.doc_ids, a.seconds))

    b, t = times(base), times(arm)
    common = [d for d in b if d in t and t[d] > 0]
    if not common:
        raise CostModelError(f"arms '{base.arm}' and '{arm.arm}' share no solved problem")
    pooled = sum(b[d] for d in common) / sum(t[d] for d in common)
    return pooled, statistics.median(b[d] / t[d] for d in common)


def ratio_profile(draft_ratio: float, verify_ratio: float, call_steps: float) -> CostProfile:
    """Costs in units of one target decode step: the draft decodes a token at ``draft_ratio`` of
    it, either model prefills a token at ``verify_ratio`` of its own decode step, and a call's
    fixed part is ``call_steps`` of the model's decode steps. Example: (0.1, 0.02, 1) is a GPU
    where a 70-token verification costs 1 + 70 * 0.02 = 2.4 decode steps."""
    target = OpCost(call_steps, verify_ratio, 1.0)
    draft = OpCost(call_steps * draft_ratio, verify_ratio * draft_ratio, draft_ratio)
    return CostProfile(f"draft {draft_ratio:g}, prefill {verify_ratio:g}, call {call_steps:g}",
                       {(Op.TARGET_WRITE, ANY_METHOD): target, (Op.VERIFY, ANY_METHOD): OpCost(call_steps, verify_ratio),
                        (Op.DRAFT_WRITE, ANY_METHOD): draft}, source="a grid point")
