"""``score``: the target rates the drafted step 0-9 in one token (SpecReason).

The judge prompt continues the reasoning chat (its opening messages as the
strategy sent them, then the steps so far and the drafted step as the
assistant's turn), adds the rating question and
pre-fills ``Score:``; the target's next-token distribution is read over the
digit tokens (:mod:`stepspec.judges.digit_score`). Because the prompt starts with the
reasoning prefix the target has just processed, most of it is served from the
prefix cache: one short prefill per judged step.

Accept when the score is at or above ``threshold``. A distribution with no
digit in its top-k is no score: the step is rejected.
"""

from __future__ import annotations

import asyncio

from typing import ClassVar, Sequence

from pydantic import Field

from stepspec.common.options import Configured
from stepspec.engine.protocol import Engine
from stepspec.judges.base import JudgeOptions, StepCandidate, Verdict, judge
from stepspec.judges.digit_score import ScoreMethod, read_score

DEFAULT_RUBRIC = (
    "Rate the last step of your reasoning above from 0 to 9: 0 means it is wrong or "
    "useless, 9 means it is correct and moves the solution forward. Answer with one digit."
)


class ScoreOptions(JudgeOptions):
    owner: ClassVar[str] = "judge 'score'"

    threshold: float = Field(7.0, ge=0, le=9, description="accept a drafted step whose 0-9 score is at or above it")
    method: ScoreMethod = Field("expected", description="how the score is read from the digits' probabilities: "
                                "'expected' (their mean) or 'argmax' (the likeliest digit)")
    rubric: str = Field(DEFAULT_RUBRIC, description="the rating question asked after the reasoning")
    step_delimiter: str = Field("\n\n", description="joins the steps so far and the drafted step in the prompt")
    top_k: int = Field(20, ge=1, description="how many of the target's likeliest next tokens are searched for digits")


@judge("score", ScoreOptions,
       about="the target rates the drafted step 0-9 in one token, read from the digits' logprobs")
class ScoreJudge(Configured):
    name = "score"
    needs_target_step = False
    needs_draft_tokens = False  # verdicts need no drafted token ids and logprobs
    draft_top_k = 0

    def __init__(self, engine: Engine, options: ScoreOptions | None = None, **overrides) -> None:
        """``options``, or keywords (``threshold=6``) validated through :class:`ScoreOptions`."""
        self.engine = engine
        self.options = ScoreOptions.build(options, **overrides)

    async def prompt(self, c: StepCandidate) -> str:
        reasoning = self.options.step_delimiter.join([*c.previous_steps, c.draft_step])
        return await self.engine.aapply_chat_template(
            [
                *c.opening_chat(),
                {"role": "assistant", "content": reasoning},
                {"role": "user", "content": self.options.rubric},
                {"role": "assistant", "content": "Score:"},
            ],
            continue_final_message=True,
        )

    async def judge(self, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        prompts = await asyncio.gather(*(self.prompt(c) for c in candidates))
        dists = await self.engine.next_token_logprobs(prompts, top_k=self.options.top_k)
        verdicts = []
        for d in dists:
            score = read_score(d, self.options.method)
            accept = score is not None and score >= self.options.threshold
            verdicts.append(Verdict(self.name, accept=accept, confident=True, score=score, num_judge_calls=1))
        return verdicts
