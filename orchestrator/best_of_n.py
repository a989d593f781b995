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
from typing import Callable

from engine.protocol import Engine, EngineError
from judges.base import Judge, JudgeError, StepCandidate
from orchestrator.prompts import opening_messages
from orchestrator.run import Budget, ReasoningError, TraceRun
from orchestrator.stepgen import generate_steps, opening_prompt
from orchestrator.steps import StepRules, find_answer, split_steps
from orchestrator.trace import StepRecord, Trace


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


async def best_of_n(question: str, *, target: Engine, judge: Judge, draft: Engine | None = None,
                    rules: StepRules = StepRules(), budget: Budget = Budget(), n: int = 5,
                    temperature: float = 0.8, seed: int = 0, vote: str = "majority", sampler: str = "draft",
                    on_step: Callable[[StepRecord], None] | None = None) -> Trace:
    if n < 1:
        raise ValueError(f"best-of-n needs n >= 1, got {n}")
    if vote not in ("majority", "weighted"):
        raise ValueError(f"vote must be 'majority' or 'weighted', got {vote!r}")
    if judge.needs_target_step:
        raise JudgeError(f"best-of-n rates each solution on its own; judge '{judge.name}' compares two steps: "
                         "use 'score'")
    if sampler == "draft" and draft is None:
        raise ValueError("best-of-n with sampler 'draft' needs a draft engine")
    engines = {"target": target, **({"draft": draft} if draft is not None else {})}
    run = TraceRun(question, "best-of-n" if sampler == "draft" else "best-of-n-target", rules, budget, engines,
                   on_step)
    model = run.engines[sampler]
    try:
        prompt = opening_prompt(model, question)
        samples = await generate_steps(model, [prompt] * n, rules, budget.max_tokens, temperature=temperature,
                                       seed=[seed * 1_000_003 + i for i in range(n)], until_end=True)
        answers = [answer_key(find_answer(s.text, rules)) for s in samples]
        votes = Counter(a for a in answers if a is not None)
        top = votes.most_common()
        tied = [a for a, c in top if c == top[0][1]] if top else []
        scores: list[float | None] = [None] * n
        if vote == "weighted" or len(tied) != 1:
            # Tie-break rule: the judge rates every solution (one batched call); each
            # answer weighs the sum of its solutions' scores; the heaviest wins.
            verdicts = await run.judge(judge, [StepCandidate(question, (), s.text,
                                                             opening_messages=opening_messages(question))
                                               for s in samples])
            scores = [v.score for v in verdicts]
            weight: dict[str | None, float] = defaultdict(float)
            for a, sc in zip(answers, scores):
                if a is not None and (vote == "weighted" or a in tied):
                    weight[a] += sc or 0.0
            winner = max(weight, key=lambda a: weight[a]) if weight else None
        else:
            winner = tied[0]
        pick = max((i for i in range(n) if answers[i] == winner),
                   key=lambda i: (scores[i] or 0.0, -i)) if winner is not None else 0
        chosen = samples[pick]
        texts = split_steps(chosen.text, rules.delimiter) or [chosen.text]
        for i, text in enumerate(texts):
            tokens = model.count_tokens(text)
            run.add(StepRecord(i, sampler, text, **{f"num_{sampler}_tokens": tokens}),
                    chosen.ends if i == len(texts) - 1 else None)
        stop = run.ended or ("eos" if chosen.complete else "max_tokens")
    except EngineError as e:
        raise ReasoningError(f"best-of-n: {e}", run.finish("error", error=str(e))) from e
    search = {"samples": [{"text": s.text, "answer": a, "num_tokens": s.num_tokens, "score": sc}
                          for s, a, sc in zip(samples, answers, scores)],
              "votes": dict(votes), "winner": winner, "judged": any(sc is not None for sc in scores),
              "chosen_sample": pick, "num_sample_tokens": sum(s.num_tokens for s in samples),
              "options": {"n": n, "temperature": temperature, "vote": vote, "sampler": sampler}}
    return run.finish(stop, search=search)


async def best_of_n_target(question: str, *, target: Engine, judge: Judge, rules: StepRules = StepRules(),
                           budget: Budget = Budget(), n: int = 5, temperature: float = 0.8, seed: int = 0,
                           vote: str = "majority", on_step: Callable[[StepRecord], None] | None = None) -> Trace:
    """The baseline: the same vote over n solutions the target samples."""
    return await best_of_n(question, target=target, judge=judge, rules=rules, budget=budget, n=n,
                           temperature=temperature, seed=seed, vote=vote, sampler="target", on_step=on_step)
