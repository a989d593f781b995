"""``score``: the target rates the drafted step 0-9 in one token (SpecReason).

The judge prompt continues the reasoning chat (its opening messages as the
strategy sent them, then the steps so far and the drafted step as the
assistant's turn), adds the rating question and
pre-fills ``Score:``; the target's next-token distribution is read over the
digit tokens (:mod:`judges.digit_score`). Because the prompt starts with the
reasoning prefix the target has just processed, most of it is served from the
prefix cache: one short prefill per judged step.

Accept when the score is at or above ``threshold``. A distribution with no
digit in its top-k is no score: the step is rejected.
"""

from __future__ import annotations

from typing import Sequence

from engine.protocol import Engine
from judges.base import JudgeError, StepCandidate, Verdict
from judges.digit_score import ScoreMethod, read_score

DEFAULT_RUBRIC = (
    "Rate the last step of your reasoning above from 0 to 9: 0 means it is wrong or "
    "useless, 9 means it is correct and moves the solution forward. Answer with one digit."
)


class ScoreJudge:
    name = "score"
    needs_target_step = False

    def __init__(self, engine: Engine, threshold: float = 7.0, method: ScoreMethod = "expected",
                 rubric: str = DEFAULT_RUBRIC, step_delimiter: str = "\n\n", top_k: int = 20) -> None:
        if not 0 <= threshold <= 9:
            raise JudgeError(f"score judge: threshold must be within 0..9, got {threshold}")
        if method not in ("expected", "argmax"):
            raise JudgeError(f"score judge: unknown score method '{method}'; choose 'expected' or 'argmax'")
        self.engine = engine
        self.threshold = threshold
        self.method = method
        self.rubric = rubric
        self.step_delimiter = step_delimiter
        self.top_k = top_k

    def prompt(self, c: StepCandidate) -> str:
        reasoning = self.step_delimiter.join([*c.previous_steps, c.draft_step])
        return self.engine.apply_chat_template(
            [
                *c.opening_chat(),
                {"role": "assistant", "content": reasoning},
                {"role": "user", "content": self.rubric},
                {"role": "assistant", "content": "Score:"},
            ],
            continue_final_message=True,
        )

    async def judge(self, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        dists = await self.engine.next_token_logprobs([self.prompt(c) for c in candidates], top_k=self.top_k)
        verdicts = []
        for d in dists:
            score = read_score(d, self.method)
            accept = score is not None and score >= self.threshold
            verdicts.append(Verdict(self.name, accept=accept, confident=True, score=score, num_judge_calls=1))
        return verdicts
