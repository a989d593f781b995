"""``cascade``: cheapest judge first, escalating only the undecided steps.

Each rung judges the candidates the rungs before it were not confident about;
the last rung decides whatever is left. Each verdict names the rung that
decided it, and :attr:`CascadeJudge.num_decided_by` counts them.

Worked example, rungs exact -> embedding -> score, three drafted steps: step 1
equals the target's (exact decides), step 2 is a paraphrase at similarity 0.95
(embedding decides), step 3 changes a number (embedding is not confident, the
target's score decides). num_decided_by = {exact: 1, embedding: 1, score: 1}.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Sequence

from judges.base import Judge, JudgeError, StepCandidate, Verdict


class CascadeJudge:
    name = "cascade"

    def __init__(self, rungs: Sequence[Judge]) -> None:
        if not rungs:
            raise JudgeError("cascade judge: needs at least one rung")
        self.rungs = list(rungs)
        self.num_decided_by: Counter[str] = Counter()

    @property
    def needs_target_step(self) -> bool:
        return any(r.needs_target_step for r in self.rungs)

    async def judge(self, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        verdicts: list[Verdict | None] = [None] * len(candidates)
        calls = [0] * len(candidates)
        pending = list(range(len(candidates)))
        for depth, rung in enumerate(self.rungs):
            if not pending:
                break
            last = depth == len(self.rungs) - 1
            results = await rung.judge([candidates[i] for i in pending])
            still = []
            for i, v in zip(pending, results):
                calls[i] += v.num_judge_calls
                if v.confident or last:
                    verdicts[i] = replace(v, num_judge_calls=calls[i])
                    self.num_decided_by[v.judge] += 1
                else:
                    still.append(i)
            pending = still
        return verdicts  # type: ignore[return-value]
