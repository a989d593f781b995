"""``llm-equivalence``: a model answers whether two steps are aligned, in one token.

The prompt shows the question and both candidate steps and pre-fills
``Answer:``; P(yes) is read from the next-token distribution, renormalized over
the "yes" and "no" tokens in the top-k. Accept when P(yes) >= ``threshold``.
Neither token in the top-k: rejected.
"""

from __future__ import annotations

import math
from typing import Sequence

from engine.protocol import Engine
from engine.types import NextTokenDistribution
from judges.base import JudgeError, StepCandidate, Verdict, require_target_steps

DEFAULT_QUESTION = (
    "Problem: {question}\n\nTwo candidate next steps of a solution:\n\nA: {draft}\n\nB: {target}\n\n"
    "Do A and B state the same reasoning and reach the same intermediate results? "
    "Answer yes or no."
)


def p_yes(dist: NextTokenDistribution) -> float | None:
    """P(yes) among the yes/no tokens of the top-k; None when neither is there."""
    best: dict[str, float] = {}
    for text, lp in dist.by_text().items():
        key = text.lower()
        if key in ("yes", "no"):
            best[key] = max(lp, best.get(key, -math.inf))
    if not best:
        return None
    yes = math.exp(best.get("yes", -math.inf))
    no = math.exp(best.get("no", -math.inf))
    return yes / (yes + no)


class LLMEquivalenceJudge:
    name = "llm-equivalence"
    needs_target_step = True

    def __init__(self, engine: Engine, threshold: float = 0.5, template: str = DEFAULT_QUESTION,
                 top_k: int = 20) -> None:
        if not 0 < threshold < 1:
            raise JudgeError(f"llm-equivalence judge: threshold must be within (0, 1), got {threshold}")
        for field in ("{question}", "{draft}", "{target}"):
            if field not in template:
                raise JudgeError(f"llm-equivalence judge: the template must contain {field}")
        self.engine = engine
        self.threshold = threshold
        self.template = template
        self.top_k = top_k

    def prompt(self, c: StepCandidate) -> str:
        text = self.template.format(question=c.question, draft=c.draft_step, target=c.target_step)
        return self.engine.apply_chat_template(
            [{"role": "user", "content": text}, {"role": "assistant", "content": "Answer:"}],
            continue_final_message=True,
        )

    async def judge(self, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        require_target_steps(self.name, candidates)
        dists = await self.engine.next_token_logprobs([self.prompt(c) for c in candidates], top_k=self.top_k)
        verdicts = []
        for d in dists:
            p = p_yes(d)
            accept = p is not None and p >= self.threshold
            verdicts.append(Verdict(self.name, accept=accept, confident=True, score=p, num_judge_calls=1))
        return verdicts
