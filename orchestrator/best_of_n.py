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

Worked example, n=5: answers 18, 18, 16, 18, 9: 18 wins three votes to one,
no score needed. Answers 18, 16, 16, 18, None: a tie; the solutions' plausible
shares are 0.97, 0.88, 0.91, 0.95: 18 wins (1.92 against 1.79).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from engine.protocol import Engine
from judges.base import Judge, JudgeError, plausible_share
from orchestrator.driver import Policy, StrategyOptions, drive_search
from orchestrator.run import TraceRun, draft_logprobs, judged_fields, written_step
from orchestrator.stepgen import GeneratedStep
from orchestrator.steps import find_answer, split_steps
from orchestrator.trace import Author, StepRecord, StopReason, Trace, Work, join_steps


class BestOfNOptions(StrategyOptions):
    n: int = Field(5, ge=1, description="whole solutions sampled, in one batch")
    temperature: float = Field(0.8, ge=0)
    seed: int = 0
    vote: Literal["majority", "weighted"] = Field("majority", description="weighted: the judge rates every "
                                                                          "solution, not only to break a tie")


def answer_key(answer: str | None) -> str | None:
    """An answer normalized for voting: numbers compared as numbers ("18.0" == "18")."""
    if answer is None:
        return None
    text = answer.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = float(text)
    except ValueError:
        return " ".join(text.split())
    return str(int(value)) if value.is_integer() else repr(value)


@dataclass
class Solution:
    """One of the n solutions, sampled whole or written step by step (verified), and its
    score: what weighs its answer in a vote."""

    sample: GeneratedStep | None = None  # sampled whole
    steps: list[StepRecord] = field(default_factory=list)  # written step by step
    ends: str | None = None  # what its last step ends (GeneratedStep.ends)
    complete: bool = False
    plausible: list[tuple[float, int]] = field(default_factory=list)  # per drafted step: (share, tokens)
    score: float | None = None

    def text(self, delimiter: str) -> str:
        return self.sample.text if self.sample else join_steps(self.steps, delimiter)

    @property
    def num_tokens(self) -> int:
        return self.sample.num_tokens if self.sample else sum(r.num_tokens for r in self.steps)


class BestOfN(Policy):
    """The search; its one step keeps the winning solution's steps and ends the trace."""

    def __init__(self, judge: Judge, options: BestOfNOptions, sampler: Author) -> None:
        if judge.needs_target_step:
            raise JudgeError(f"best-of-n rates each solution on its own; judge '{judge.name}' compares two steps: "
                             "use 'likelihood' or 'score'")
        self.name = "best-of-n" if sampler is Author.DRAFT else "best-of-n-target"
        self.judge, self.options, self.sampler = judge, options, sampler
        self.verified = sampler is Author.DRAFT and getattr(judge, "needs_draft_tokens", False)
        self.found: dict[str, Any] = {}

    async def step(self, run: TraceRun) -> None:
        o = self.options
        if self.verified:
            solutions = await write_verified(run, self.judge, o)
        else:
            samples = await run.write_many(self.sampler, [run.steps] * o.n, run.budget.max_tokens, until_end=True,
                                           temperature=o.temperature, logprobs=draft_logprobs(self.judge),
                                           seed=[o.seed * 1_000_003 + i for i in range(o.n)])
            solutions = [Solution(s, ends=s.ends, complete=s.complete) for s in samples]
        answers = [answer_key(find_answer(s.text(run.rules.delimiter), run.rules)) for s in solutions]
        votes = Counter(a for a in answers if a is not None)
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
        steps = chosen.steps or await split_sample(run, self.sampler, chosen.sample)
        for i, record in enumerate(steps):
            run.add(record, chosen.ends if i == len(steps) - 1 else None)
        run.end(StopReason.EOS if chosen.complete else StopReason.MAX_TOKENS)  # unless its last step ended it
        self.found = {"samples": [{"text": s.text(run.rules.delimiter), "answer": a, "num_tokens": s.num_tokens,
                                   "score": s.score, "cuts": [r.cut for r in s.steps if r.cut is not None]}
                                  for s, a in zip(solutions, answers)],
                      "votes": dict(votes), "winner": winner, "judged": any(s.score is not None for s in solutions),
                      "chosen_sample": pick, "num_sample_tokens": sum(s.num_tokens for s in solutions)}

    def search(self) -> dict[str, Any]:
        o = self.options
        return {**self.found, "options": {"n": o.n, "temperature": o.temperature, "vote": o.vote,
                                          "sampler": self.sampler.value, "verified": self.verified}}


async def write_verified(run: TraceRun, judge: Judge, o: BestOfNOptions) -> list[Solution]:
    """n drafted solutions under step verification. Each round, every unfinished solution
    drafts a step (one batched call, sampled), the verifier checks them all (one batch), and
    the target repairs the rejected ones at their cuts (one batched call, sampled too)."""
    solutions = [Solution() for _ in range(o.n)]
    for depth in range(run.budget.max_steps):
        live = [i for i, s in enumerate(solutions) if not s.ends and s.num_tokens < run.budget.max_tokens]
        if not live:
            break
        bases = [[*run.steps, *solutions[i].steps] for i in live]
        seeds = [o.seed * 1_000_003 + depth * 10_007 + i for i in live]
        drafted = await run.write_many(Author.DRAFT, bases, temperature=o.temperature, seed=seeds,
                                       logprobs=draft_logprobs(judge, o.temperature))
        verdicts = await run.judge(judge, [run.candidate(d, b, temperature=o.temperature, seed=seed)
                                           for d, b, seed in zip(drafted, bases, seeds)])
        cut = [j for j, v in enumerate(verdicts) if not v.accept]
        mended = dict(zip(cut, await run.rewrite_many([verdicts[j] for j in cut], [bases[j] for j in cut],
                                                      temperature=o.temperature, seed=[seeds[j] for j in cut])))
        for j, (i, d, v) in enumerate(zip(live, drafted, verdicts)):
            s = solutions[i]
            step, author = (mended[j], Author.TARGET) if j in mended else (d, Author.DRAFT)
            s.steps.append(written_step(len(s.steps), author, step, **judged_fields(d, v)))
            s.ends, s.complete = step.ends, step.complete
            s.plausible.append((v.plausible if v.plausible is not None else float(v.accept), len(d.token_ids)))
    return solutions


async def score_solutions(run: TraceRun, judge: Judge, solutions: list[Solution]) -> None:
    """Each solution's score: the share of its drafted tokens the verifier found plausible
    (from its step verdicts when it was verified as written, else one batched call over the
    whole samples), or with a whole-step judge its rating."""
    unscored = [s for s in solutions if not s.plausible]
    if getattr(judge, "needs_draft_tokens", False):
        verdicts = await run.judge(judge, [run.candidate(s.sample) for s in unscored]) if unscored else []
        for s, v in zip(unscored, verdicts):
            s.plausible = [(v.plausible, len(s.sample.token_ids))]
        for s in solutions:
            s.score = plausible_share(s.plausible)
    else:
        for s, v in zip(solutions, await run.judge(judge, [run.rating(s.text(run.rules.delimiter))
                                                           for s in solutions])):
            s.score = v.score


async def split_sample(run: TraceRun, author: Author, sample: GeneratedStep) -> list[StepRecord]:
    """A solution sampled whole, cut into steps (each counted in the sampler's tokens)."""
    texts = split_steps(sample.text, run.rules.delimiter) or [sample.text]
    return [StepRecord.written(i, author, text, Work(await run.engines[author].acount_tokens(text)))
            for i, text in enumerate(texts)]


async def best_of_n(question: str, *, target: Engine, judge: Judge, draft: Engine | None = None,
                    sampler: str = "draft", **options: Any) -> Trace:
    """``options``: :class:`BestOfNOptions`, and the driver's ``rules``, ``budget``, ``on_step``.
    ``sampler``: who samples the solutions ("target": the ``best-of-n-target`` baseline)."""
    return await drive_search("best-of-n", BestOfN, BestOfNOptions, question, sampler,
                              {"target": target, "draft": draft}, judge, options)


async def best_of_n_target(question: str, *, target: Engine, judge: Judge, **options: Any) -> Trace:
    """The baseline: the same vote over n solutions the target samples."""
    return await best_of_n(question, target=target, judge=judge, sampler="target", **options)
