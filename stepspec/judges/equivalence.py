"""``llm-equivalence``: a model answers whether two steps are aligned, in one token.

The prompt shows the question and both candidate steps and pre-fills
``Answer:``; P(yes) is read from the next-token distribution, renormalized over
the "yes" and "no" tokens in the top-k. Accept when P(yes) >= ``threshold``.
Neither token in the top-k: rejected.
"""

from __future__ import annotations

import asyncio

import math
from typing import ClassVar, Sequence

from pydantic import Field, field_validator

from stepspec.common.options import Configured
from stepspec.engine.protocol import Engine
from stepspec.engine.types import NextTokenDistribution
from stepspec.judges.base import JudgeOptions, StepCandidate, Verdict, judge, require_target_steps

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


class LLMEquivalenceOptions(JudgeOptions):
    owner: ClassVar[str] = "judge 'llm-equivalence'"

    threshold: float = Field(0.5, gt=0, lt=1, description="accept when P(yes) is at or above it")
    template: str = Field(DEFAULT_QUESTION, description="the question asked, with {question}, {draft} and {target}")
    top_k: int = Field(20, ge=1, description="how many of the model's likeliest next tokens are searched for yes/no")

    @field_validator("template")
    @classmethod
    def _has_the_fields(cls, template: str) -> str:
        missing = [f for f in ("{question}", "{draft}", "{target}") if f not in template]
        if missing:
            raise ValueError(f"must contain {{question}}, {{draft}} and {{target}}; it lacks {', '.join(missing)}")
        return template


@judge("llm-equivalence", LLMEquivalenceOptions,
       about="the target answers yes or no, in one token, to whether the drafted and its own step say the same")
class LLMEquivalenceJudge(Configured):
    name = "llm-equivalence"
    needs_target_step = True
    needs_draft_tokens = False  # verdicts need no drafted token ids and logprobs
    draft_top_k = 0

    def __init__(self, engine: Engine, options: LLMEquivalenceOptions | None = None, **overrides) -> None:
        """``options``, or keywords (``threshold=0.7``) validated through :class:`LLMEquivalenceOptions`."""
        self.engine = engine
        self.options = LLMEquivalenceOptions.build(options, **overrides)

    async def prompt(self, c: StepCandidate) -> str:
        text = self.options.template.format(question=c.question, draft=c.draft_step, target=c.target_step)
        return await self.engine.aapply_chat_template(
            [{"role": "user", "content": text}, {"role": "assistant", "content": "Answer:"}],
            continue_final_message=True,
        )

    async def judge(self, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        require_target_steps(self.name, candidates)
        prompts = await asyncio.gather(*(self.prompt(c) for c in candidates))
        dists = await self.engine.next_token_logprobs(prompts, top_k=self.options.top_k)
        verdicts = []
        for d in dists:
            p = p_yes(d)
            accept = p is not None and p >= self.options.threshold
            verdicts.append(Verdict(self.name, accept=accept, confident=True, score=p, num_judge_calls=1))
        return verdicts
