"""``best-of-n``: sample n solutions, vote on their answers, the target breaks ties.

Self-consistency (Wang et al., 2023) with the samples drafted by the small
model (``best-of-n``) or, as the baseline, by the target (``best-of-n-target``).
The answers are compared after normalization (numbers as numbers); the most
frequent wins. On a tie, or with ``vote="weighted"`` always, each solution's
score weighs its answer.

With the default judge, the ``likelihood`` verifier, the n drafted solutions
are written under step verification: each round, every unfinished solution
drafts its next step (one batched call, sampled), the verifier checks all of
them against the target's token logprobs (one batch), and the target repairs
each rejected step at its cut (one batched call): the drafted tokens before the
cut stay and the target writes the step on, sampling at the same temperature.
A solution's score is the share of its drafted tokens the target found
plausible. The target's own samples (``best-of-n-target``) are written whole,
all n in one call; when a vote needs scores the verifier scores their tokens
the same way. With a whole-step judge (``score``: the target's 0-9 self-score)
the drafted solutions are written whole too and the judge rates each.

The target samples the first ``first_target_steps`` steps of every drafted solution
(default 2: the opening and the plan, as in ``specreason``), at the same temperature and
one batched call per step, so the n plans stay as diverse as the target's own; the draft
writes on from there. Those steps are not judged and not in the score.

``backoff`` (goodput, :mod:`stepspec.orchestrator.goodput`): before each verified round the
governor shared by the problems in flight decides whether drafting pays at the measured
load. When it does not (many problems in flight: the target decodes them in one batch,
and a round of draft, verify and repair costs more per token), the target samples the
rest of every unfinished solution whole, in one batched call, as ``best-of-n-target``
does; those steps say ``backoff=True``. Alone, the draft drafts.

Worked example, n=5: answers 18, 18, 16, 18, 9: 18 wins three votes to one,
no score needed. Answers 18, 16, 16, 18, None: a tie; the solutions' plausible
shares are 0.97, 0.88, 0.91, 0.95: 18 wins (1.92 against 1.79).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from stepspec.judges.base import Judge, JudgeError, plausible_share
from stepspec.orchestrator.driver import Backoff, Policy, StrategyOptions, TargetOpening, Turn
from stepspec.orchestrator.registry import strategy
from stepspec.orchestrator.run import TraceRun, draft_logprobs, judged_fields, written_step
from stepspec.orchestrator.stepgen import GeneratedStep
from stepspec.orchestrator.steps import tally
from stepspec.orchestrator.trace import Author, StepEnd, StepRecord, StopReason, Work, join_steps


class BestOfNTargetOptions(StrategyOptions):
    """The vote's options; ``best-of-n-target`` (the baseline, the target sampling) takes these."""

    n: int = Field(5, ge=1, description="whole solutions sampled, in one batch")
    temperature: float = Field(0.8, ge=0)
    seed: int = 0
    vote: Literal["majority", "weighted"] = Field("majority", description="weighted: the judge rates every "
                                                                          "solution, not only to break a tie")


class BestOfNOptions(BestOfNTargetOptions, Backoff, TargetOpening):
    """``best-of-n``'s: the vote's, the target's opening, and backing off under load."""


@dataclass
class Ballot:
    """One of the n solutions, written step by step (the target's opening; verified steps),
    then, unless verified, sampled whole from there; and its score: what weighs its answer
    in a vote."""

    sample: GeneratedStep | None = None  # sampled whole, after ``steps``
    sampler: Author | None = None  # who sampled it
    steps: list[StepRecord] = field(default_factory=list)  # written step by step
    ends: StepEnd | None = None  # what its last step ends (GeneratedStep.ends)
    complete: bool = False
    plausible: list[tuple[float, int]] = field(default_factory=list)  # per drafted step: (share, tokens)
    score: float | None = None

    def text(self, delimiter: str) -> str:
        text = join_steps(self.steps, delimiter)
        if self.sample is None:
            return text
        return text + (delimiter if self.steps and self.steps[-1].complete else "") + self.sample.text

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.steps) + (self.sample.num_tokens if self.sample else 0)

    def open(self, run: TraceRun) -> bool:
        """Whether it goes on: its last step ended nothing and it has tokens left."""
        return not self.ends and self.num_tokens < run.budget.max_tokens

    def add(self, author: Author, step: GeneratedStep, **judged: Any) -> None:
        self.steps.append(written_step(len(self.steps), author, step, **judged))
        self.ends, self.complete = step.ends, step.complete


@strategy("best-of-n", BestOfNOptions, default_judge="likelihood", queued_judge=True,
          writes="n drafted solutions, verified step by step, then a vote")
class BestOfN(Policy):
    """The search; its one step keeps the winning solution's steps and ends the trace. It
    picks who writes per round (:func:`write_verified`), so the driver does not (UNGOVERNED)."""

    sampler = Author.DRAFT  # who samples the solutions past their openings

    def __init__(self, options: BestOfNTargetOptions, judge: Judge) -> None:
        if judge.needs_target_step:
            raise JudgeError(f"best-of-n rates each solution on its own; judge '{judge.name}' compares two steps: "
                             "use 'likelihood' or 'score'")
        self.judge, self.options = judge, options
        self.verified = self.sampler is Author.DRAFT and judge.needs_draft_tokens
        self.found: dict[str, Any] = {}

    def turn(self, run: TraceRun) -> Turn:
        return Turn.UNGOVERNED

    async def step(self, run: TraceRun) -> None:
        o = self.options
        solutions = [Ballot() for _ in range(o.n)]
        if self.sampler is Author.DRAFT:
            await write_opening(run, o, solutions)
        if self.verified:
            await write_verified(run, self.judge, o, solutions)
        else:
            await write_whole(run, self.judge, o, self.sampler, solutions)
        answers, votes = tally([s.text(run.rules.delimiter) for s in solutions], run.rules)
        top = votes.most_common()
        tied = [a for a, c in top if c == top[0][1]] if top else []
        winner = tied[0] if len(tied) == 1 else None
        if o.vote == "weighted" or len(tied) != 1:
            # Tie-break rule: each answer weighs the sum of its solutions' scores (the
            # verifier's plausible shares, or the judge's ratings); the heaviest wins.
            await score_solutions(run, self.judge, solutions)
            weight: dict[str, float] = defaultdict(float)
            for a, sol in zip(answers, solutions):
                if a is not None and (o.vote == "weighted" or a in tied):
                    weight[a] += sol.score or 0.0
            winner = max(weight, key=lambda a: weight[a]) if weight else None
        pick = max((i for i in range(o.n) if answers[i] == winner),
                   key=lambda i: (solutions[i].score or 0.0, -i)) if winner is not None else 0
        chosen = solutions[pick]
        # A drafted solution sampled whole by the target: drafting did not pay at the load.
        steps = chosen.steps + (await split_sample(run, chosen.sampler, chosen.sample, len(chosen.steps),
                                                   backoff=chosen.sampler is not self.sampler)
                                if chosen.sample else [])
        run.adopt(steps, chosen.ends, StopReason.EOS if chosen.complete else StopReason.MAX_TOKENS)
        self.found = {"samples": [{"text": s.text(run.rules.delimiter), "answer": a, "num_tokens": s.num_tokens,
                                   "score": s.score, "cuts": [r.cut for r in s.steps if r.cut is not None]}
                                  for s, a in zip(solutions, answers)],
                      "votes": dict(votes), "winner": winner, "judged": any(s.score is not None for s in solutions),
                      "chosen_sample": pick, "num_sample_tokens": sum(s.num_tokens for s in solutions)}

    def search(self) -> dict[str, Any]:
        return {**self.found, "options": {**self.options.model_dump(exclude={"seed"}), "sampler": self.sampler.value,
                                          "verified": self.verified}}


@strategy("best-of-n-target", BestOfNTargetOptions, needs_draft=False, default_judge="likelihood", queued_judge=True,
          writes="n solutions the target samples, the same vote (the baseline)")
class BestOfNTarget(BestOfN):
    """The baseline: the same vote over n solutions the target samples."""

    sampler = Author.TARGET


def seeds(o: BestOfNTargetOptions, depth: int, solutions: list[int]) -> list[int]:
    """The sampling seeds of ``solutions`` (indices) at step ``depth``: siblings differ."""
    return [o.seed * 1_000_003 + depth * 10_007 + i for i in solutions]


async def write_opening(run: TraceRun, o: BestOfNOptions, solutions: list[Ballot]) -> None:
    """The target's first ``o.first_target_steps`` steps of every solution, sampled (one
    batched call per step): the opening and the plan, as diverse as the target's own."""
    for depth in range(o.first_target_steps):
        live = [i for i, s in enumerate(solutions) if s.open(run)]
        if not live:
            break
        written = await run.write_many(Author.TARGET, [[*run.steps, *solutions[i].steps] for i in live],
                                       temperature=o.temperature, seed=seeds(o, depth, live))
        for i, step in zip(live, written):
            solutions[i].add(Author.TARGET, step)


async def write_whole(run: TraceRun, judge: Judge, o: BestOfNTargetOptions, sampler: Author,
                      solutions: list[Ballot]) -> None:
    """Each unfinished solution sampled whole by ``sampler`` from where it stands, in one
    batched call, within the tokens the budget leaves it."""
    live = [i for i, s in enumerate(solutions) if s.open(run)]
    samples = await run.write_many(sampler, [[*run.steps, *solutions[i].steps] for i in live],
                                   [run.budget.max_tokens - solutions[i].num_tokens for i in live],
                                   until_end=True, temperature=o.temperature, logprobs=draft_logprobs(judge),
                                   seed=[o.seed * 1_000_003 + i for i in live])
    for i, sample in zip(live, samples):
        s = solutions[i]
        s.sample, s.sampler, s.ends, s.complete = sample, sampler, sample.ends, sample.complete


async def write_verified(run: TraceRun, judge: Judge, o: BestOfNOptions, solutions: list[Ballot]) -> None:
    """The drafted solutions, on from their openings, under step verification. Each round,
    every unfinished solution drafts a step (one batched call, sampled), the verifier checks
    them all (one batch), and the target repairs the rejected ones at their cuts (one batched
    call, sampled too). When drafting does not pay at the load, the target samples the rest."""
    for depth in range(o.first_target_steps, run.budget.max_steps):
        live = [i for i, s in enumerate(solutions) if s.open(run)]
        if not live:
            break
        if run.decide(lambda: sum(s.num_tokens for s in solutions)) is Author.TARGET:  # goodput
            await write_whole(run, judge, o, Author.TARGET, solutions)
            return
        bases, sown = [[*run.steps, *solutions[i].steps] for i in live], seeds(o, depth, live)
        drafted = await run.write_many(Author.DRAFT, bases, temperature=o.temperature, seed=sown,
                                       logprobs=draft_logprobs(judge, o.temperature))
        verdicts = await run.judge(judge, [run.candidate(d, b, temperature=o.temperature, seed=seed)
                                           for d, b, seed in zip(drafted, bases, sown)])
        cut = [j for j, v in enumerate(verdicts) if not v.accept]
        mended = dict(zip(cut, await run.rewrite_many([verdicts[j] for j in cut], [bases[j] for j in cut],
                                                      temperature=o.temperature, seed=[sown[j] for j in cut])))
        for j, (i, d, v) in enumerate(zip(live, drafted, verdicts)):
            s = solutions[i]
            s.add(*((Author.TARGET, mended[j]) if j in mended else (Author.DRAFT, d)), **judged_fields(d, v))
            s.plausible.append((v.plausible if v.plausible is not None else float(v.accept), len(d.token_ids)))


async def score_solutions(run: TraceRun, judge: Judge, solutions: list[Ballot]) -> None:
    """Each solution's score: the share of its drafted tokens the verifier found plausible
    (from its step verdicts when it was verified as written, else one batched call over the
    whole samples), or with a whole-step judge its rating."""
    unscored = [s for s in solutions if s.sample is not None]
    if judge.needs_draft_tokens:
        verdicts = await run.judge(judge, [run.candidate(s.sample, [*run.steps, *s.steps])
                                           for s in unscored]) if unscored else []
        for s, v in zip(unscored, verdicts):
            s.plausible.append((v.plausible, len(s.sample.token_ids)))
        for s in solutions:
            s.score = plausible_share(s.plausible)
    else:
        for s, v in zip(solutions, await run.judge(judge, [run.rating(s.text(run.rules.delimiter))
                                                           for s in solutions])):
            s.score = v.score


async def split_sample(run: TraceRun, author: Author, sample: GeneratedStep, first: int = 0,
                       backoff: bool = False) -> list[StepRecord]:
    """A solution sampled whole, cut into steps numbered from ``first`` (each counted in the
    sampler's tokens)."""
    return [StepRecord.written(first + i, author, text, Work(n), backoff=backoff)
            for i, (text, n) in enumerate(await run.steps_in(author, sample.text))]
