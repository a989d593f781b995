"""The judge protocol: decide about drafted reasoning steps, a batch at a time.

A judge sees each drafted step in its context (the question and the steps
before it) and, for equivalence judges, the step the target wrote at the same
position. It returns a :class:`Verdict`: accept or reject, how sure it is, and
the score it read when it has one. A verdict that is not ``confident`` lets a
cascade escalate to a costlier judge; used alone, a judge's ``accept`` stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable


class JudgeError(ValueError):
    """A judge was misconfigured or given what it cannot judge."""


@dataclass(frozen=True)
class StepCandidate:
    """One drafted step to judge."""

    question: str
    previous_steps: tuple[str, ...]
    draft_step: str
    target_step: str | None = None  # the target's step at this position, when one exists
    # The chat that opened the reasoning (system prompt, question), as the strategy
    # sent it: a judge that continues the reasoning reuses it, so its prompt shares
    # the prefix the target has cached. Empty: just the question as a user turn.
    opening_messages: tuple[tuple[str, str], ...] = ()

    def opening_chat(self) -> list[dict[str, str]]:
        if self.opening_messages:
            return [{"role": role, "content": content} for role, content in self.opening_messages]
        return [{"role": "user", "content": self.question}]


@dataclass(frozen=True)
class Verdict:
    judge: str  # the judge that decided (a cascade names its deciding rung)
    accept: bool
    confident: bool = True
    score: float | None = None  # judge-specific: 0-9 score, cosine similarity, P(aligned)
    num_judge_calls: int = 0  # model calls spent on this verdict (0 for text/embedding rules)


@runtime_checkable
class Judge(Protocol):
    name: str
    # True when verdicts need StepCandidate.target_step (semantic-equivalence judges).
    needs_target_step: bool

    async def judge(self, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        """One verdict per candidate, in order."""
        ...


def require_target_steps(judge_name: str, candidates: Sequence[StepCandidate]) -> None:
    missing = [i for i, c in enumerate(candidates) if c.target_step is None]
    if missing:
        raise JudgeError(
            f"judge '{judge_name}' compares the draft's step with the target's, but candidates "
            f"{missing} have no target_step; use it with a strategy that writes both (lookahead), "
            "or use the 'score' judge"
        )
