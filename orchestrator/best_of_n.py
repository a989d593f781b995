"""``best-of-n``: sample n whole solutions, vote on their answers, the target breaks ties.

Self-consistency (Wang et al., 2023) with the samples drafted by the small
model (``best-of-n``) or, as the baseline, by the target (``best-of-n-target``),
all n in one batched call. The answers are compared after normalization
(numbers as numbers); the most frequent wins. On a tie, or with
``vote="weighted"`` always, the judge (the target's 0-9 score by default) rates
each solution and the answers are weighed by their solutions' scores.

Worked example, n=5: answers 18, 18, 16, 18, 9: 18 wins three votes to one,
no judge call. Answers 18, 16, 16, 18, None: a tie; the target scores the four
solutions 8.1, 3.2, 4.0, 7.7: 18 wins (15.8 against 7.2).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Literal

from pydantic import Field

from engine.protocol import Engine
from judges.base import Judge, JudgeError
from orchestrator.driver import Policy, StrategyOptions, drive, sampler_author, split_shared
from orchestrator.run import TraceRun
from orchestrator.stepgen import GeneratedStep
from orchestrator.steps import find_answer, split_steps
from orchestrator.trace import Author, StepRecord, StopReason, Trace, Work


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


class BestOfN(Policy):
    """The search; its one step keeps the winning solution's steps and ends the trace."""

    def __init__(self, judge: Judge, options: BestOfNOptions, sampler: Author) -> None:
        if judge.needs_target_step:
            raise JudgeError(f"best-of-n rates each solution on its own; judge '{judge.name}' compares two steps: "
                             "use 'score'")
        self.name = "best-of-n" if sampler is Author.DRAFT else "best-of-n-target"
        self.judge, self.options, self.sampler = judge, options, sampler
        self.found: dict[str, Any] = {}

    async def step(self, run: TraceRun) -> None:
        o = self.options
        samples = await run.write_many(self.sampler, [run.steps] * o.n, run.budget.max_tokens, until_end=True,
                                       temperature=o.temperature, seed=[o.seed * 1_000_003 + i for i in range(o.n)])
        answers = [answer_key(find_answer(s.text, run.rules)) for s in samples]
        votes = Counter(a for a in answers if a is not None)
        top = votes.most_common()
        tied = [a for a, c in top if c == top[0][1]] if top else []
        scores: list[float | None] = [None] * o.n
        winner = tied[0] if len(tied) == 1 else None
        if o.vote == "weighted" or len(tied) != 1:
            # Tie-break rule: the judge rates every solution (one batched call); each
            # answer weighs the sum of its solutions' scores; the heaviest wins.
            scores = [v.score for v in await run.judge(self.judge, [run.rating(s.text) for s in samples])]
            weight: dict[str, float] = defaultdict(float)
            for a, sc in zip(answers, scores):
                if a is not None and (o.vote == "weighted" or a in tied):
                    weight[a] += sc or 0.0
            winner = max(weight, key=lambda a: weight[a]) if weight else None
        pick = max((i for i in range(o.n) if answers[i] == winner),
                   key=lambda i: (scores[i] or 0.0, -i)) if winner is not None else 0
        await self.keep(run, samples[pick])
        self.found = {"samples": [{"text": s.text, "answer": a, "num_tokens": s.num_tokens, "score": sc}
                                  for s, a, sc in zip(samples, answers, scores)],
                      "votes": dict(votes), "winner": winner, "judged": any(sc is not None for sc in scores),
                      "chosen_sample": pick, "num_sample_tokens": sum(s.num_tokens for s in samples)}

    async def keep(self, run: TraceRun, chosen: GeneratedStep) -> None:
        """The chosen solution, cut into steps, as the trace; it stops where the solution did."""
        texts = split_steps(chosen.text, run.rules.delimiter) or [chosen.text]
        for i, text in enumerate(texts):
            work = Work(await run.engines[self.sampler].acount_tokens(text))
            run.add(StepRecord.written(i, self.sampler, text, work), chosen.ends if i == len(texts) - 1 else None)
        run.end(StopReason.EOS if chosen.complete else StopReason.MAX_TOKENS)

    def search(self) -> dict[str, Any]:
        o = self.options
        return {**self.found, "options": {"n": o.n, "temperature": o.temperature, "vote": o.vote,
                                          "sampler": self.sampler.value}}


async def best_of_n(question: str, *, target: Engine, judge: Judge, draft: Engine | None = None,
                    sampler: str = "draft", **options: Any) -> Trace:
    """``options``: :class:`BestOfNOptions`, and the driver's ``rules``, ``budget``, ``on_step``.
    ``sampler``: who samples the solutions ("target": the ``best-of-n-target`` baseline)."""
    author = sampler_author("best-of-n", sampler, draft)
    shared, options = split_shared(options)
    name = "best-of-n" if author is Author.DRAFT else "best-of-n-target"
    policy = BestOfN(judge, BestOfNOptions.parse(name, options), author)
    return await drive(policy, question, {"target": target, "draft": draft}, **shared)


async def best_of_n_target(question: str, *, target: Engine, judge: Judge, **options: Any) -> Trace:
    """The baseline: the same vote over n solutions the target samples."""
    return await best_of_n(question, target=target, judge=judge, sampler="target", **options)
