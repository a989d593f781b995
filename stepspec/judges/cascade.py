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
from typing import Any, ClassVar, Literal, Sequence

from pydantic import ConfigDict, Field

from stepspec.judges.base import JUDGES, Judge, JudgeError, JudgeOptions, StepCandidate, Verdict, judge
from stepspec.judges.embedding import EmbeddingOptions
from stepspec.judges.equivalence import LLMEquivalenceOptions
from stepspec.judges.exact import ExactOptions
from stepspec.judges.likelihood import LikelihoodOptions
from stepspec.judges.score import ScoreOptions

RungName = Literal["score", "likelihood", "exact", "embedding", "llm-equivalence"]


class CascadeOptions(JudgeOptions):
    """The rungs by name, cheapest first, and each rung judge's options by its name."""

    model_config = ConfigDict(populate_by_name=True)
    owner: ClassVar[str] = "judge 'cascade'"

    rungs: tuple[RungName, ...] = Field(("exact", "embedding", "score"), min_length=1,
                                        description="the judges asked in turn, cheapest first")
    score: ScoreOptions = Field(default_factory=ScoreOptions, description="the score rung's options")
    likelihood: LikelihoodOptions = Field(default_factory=LikelihoodOptions,
                                          description="the likelihood rung's options")
    exact: ExactOptions = Field(default_factory=ExactOptions, description="the exact rung's options")
    embedding: EmbeddingOptions = Field(default_factory=EmbeddingOptions, description="the embedding rung's options")
    llm_equivalence: LLMEquivalenceOptions = Field(default_factory=LLMEquivalenceOptions, alias="llm-equivalence",
                                                   description="the llm-equivalence rung's options")

    def rung_options(self, rung: str) -> JudgeOptions:
        return getattr(self, rung.replace("-", "_"))


@judge("cascade", CascadeOptions, needs_engine=False,
       about="its rungs in turn (exact, embedding, score), each deciding only the steps the ones before "
             "it were unsure of")
class CascadeJudge:
    name = "cascade"

    def __init__(self, rungs: Sequence[Judge]) -> None:
        if not rungs:
            raise JudgeError("cascade judge: needs at least one rung")
        self.rungs = list(rungs)
        self.num_decided_by: Counter[str] = Counter()

    @classmethod
    def from_options(cls, engine: Any, options: CascadeOptions) -> "CascadeJudge":
        """The cascade its options name: each rung the registered judge, built with its own options."""
        return cls([JUDGES[r].build(engine, options.rung_options(r)) for r in options.rungs])

    @property
    def needs_target_step(self) -> bool:
        return any(r.needs_target_step for r in self.rungs)

    @property
    def needs_draft_tokens(self) -> bool:
        return any(r.needs_draft_tokens for r in self.rungs)

    @property
    def draft_top_k(self) -> int:
        return max(r.draft_top_k for r in self.rungs)

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
