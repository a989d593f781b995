"""The judge protocol: decide about drafted reasoning steps, a batch at a time.

A judge sees each drafted step in its context (the question and the steps
before it) and, for equivalence judges, the step the target wrote at the same
position. It returns a :class:`Verdict`: accept or reject, how sure it is, and
the score it read when it has one. A verdict that is not ``confident`` lets a
cascade escalate to a costlier judge; used alone, a judge's ``accept`` stands.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol, Sequence, TypeVar, runtime_checkable

from stepspec.common.options import Options
from stepspec.common.registry import Entry, Registry


class JudgeError(ValueError):
    """A judge was misconfigured or given what it cannot judge."""


class JudgeOptions(Options):
    """Base of each judge's options model (one per judge, beside its class): frozen,
    unknown options refused, a mistake raised as :class:`JudgeError`."""

    error: ClassVar[type[Exception]] = JudgeError


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
    # What a token-level verifier (``likelihood``) reads: the exact prompt text the step
    # continues, rendered for the target, and the drafted step as the draft generated
    # it: token ids (its stop token included), each token's logprob and text.
    prefix: str | None = None
    draft_token_ids: tuple[int, ...] = ()
    draft_token_logprobs: tuple[float, ...] = ()
    draft_token_texts: tuple[str, ...] = ()
    # For a sampling verifier (speculative sampling): the temperature the step was sampled
    # at and is to be tested at (0: test it by the per-token rules), the draft's top
    # alternatives per token as (token id, raw logprob), and a seed for the verifier's draws.
    temperature: float = 0.0
    draft_token_tops: tuple[tuple[tuple[int, float], ...], ...] = ()
    seed: int | None = None
    # The step holds a tool call: a token-level verifier keeps only the target's own
    # (greedy) tokens of it, since an argument the target would not write is a wrong call.
    exact: bool = False
    # Character spans of draft_step that a call's constraint wrote itself, where the model had no
    # choice (a bound call's `{"name": "add", "arguments": `): a token-level verifier does not test
    # the tokens inside them (the target, bound, would have written them too).
    forced: tuple[tuple[int, int], ...] = ()
    # The drafted text starts a step (not the draft drafting on in a step the target cut).
    starts_step: bool = True

    def opening_chat(self) -> list[dict[str, str]]:
        if self.opening_messages:
            return [{"role": role, "content": content} for role, content in self.opening_messages]
        return [{"role": "user", "content": self.question}]


class CutRule(str, enum.Enum):
    """Which per-token rule found a drafted token implausible (``likelihood`` judge)."""

    FLOOR = "floor"  # the target's logprob of the token is under the floor
    RANK = "rank"  # the token is not among the target's max_rank most likely
    CONTRAST = "contrast"  # target logprob minus draft logprob is under the contrast bound
    MATH_RANK = "math_rank"  # a token with a digit or operator outside the target's math_max_rank
    RATIO = "ratio"  # a sampled token that lost the draw min(1, p_target / p_draft)
    LEAD = "lead"  # one of a step's first lead_tokens outside the target's lead_max_rank most likely

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value


@dataclass(frozen=True)
class TokenCut:
    """Where a token-level verifier cut a drafted step: the drafted tokens before
    ``offset`` are kept, the target's own token goes in at ``offset`` and the target
    writes the rest of the step."""

    offset: int  # index of the cut token among the drafted step's tokens
    token: str  # the drafted token's text
    target_logprob: float  # the target's logprob of the drafted token
    draft_logprob: float | None  # the draft's own logprob of it (None: not known)
    rank: int  # its rank among the target's choices (1: the target's greedy token)
    rule: CutRule
    target_token_id: int  # the target's token at that position: its top-1, or the one resampled
    kept_text: str  # the text of the kept drafted tokens
    # Sampling verifier: the text of the token resampled at the cut; the target writes on
    # after it (None: the target writes from the cut, its own greedy token first).
    resampled_text: str | None = None

    def to_dict(self) -> dict:
        return {"offset": self.offset, "token": self.token, "target_logprob": self.target_logprob,
                "draft_logprob": self.draft_logprob, "rank": self.rank, "rule": self.rule.value,
                "target_token_id": self.target_token_id, "kept_text": self.kept_text,
                **({"resampled_text": self.resampled_text} if self.resampled_text is not None else {})}


@dataclass(frozen=True)
class Verdict:
    judge: str  # the judge that decided (a cascade names its deciding rung)
    accept: bool
    confident: bool = True
    score: float | None = None  # judge-specific: 0-9 score, cosine similarity, P(aligned)
    num_judge_calls: int = 0  # model calls spent on this verdict (0 for text/embedding rules)
    # A token-level verifier's cut of a rejected step: keep its plausible prefix. None:
    # the whole step is accepted or rejected.
    cut: TokenCut | None = None
    # A token-level verifier's share of the step's tokens that break no rule (1.0: none
    # does), over the whole step, not only up to the cut. None: not a token-level verdict.
    plausible: float | None = None


def plausible_share(parts: Sequence[tuple[float, int]]) -> float:
    """The share of tokens a token-level verifier found plausible over several steps, each
    given as (its ``Verdict.plausible``, its tokens): weighted by tokens, never a mean of
    per-step shares (1.0 with no tokens, as for an empty step)."""
    total = sum(n for _, n in parts)
    return sum(share * n for share, n in parts) / total if total else 1.0


@runtime_checkable
class Judge(Protocol):
    name: str
    # True when verdicts need StepCandidate.target_step (semantic-equivalence judges).
    needs_target_step: bool
    # True when verdicts need the drafted step's token ids and logprobs (the likelihood verifier).
    needs_draft_tokens: bool
    # How many of the draft's top alternatives per token the verdicts need (sampled drafts; 0: none).
    draft_top_k: int

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


@dataclass(frozen=True)
class JudgeEntry(Entry):
    """A registered judge: its class (built as ``judge(engine, options)`` where it asks a model,
    ``judge(options)`` where it does not, or by its own ``from_options(engine, options)``)."""

    judge: Callable[..., Judge] = field(default=None, repr=False)  # type: ignore[assignment]
    needs_engine: bool = True
    about: str = ""  # what it decides by, in a few words (the docs' judge table)

    def build(self, engine: Any, options: Any) -> Judge:
        """The judge, with ``engine`` (the model it asks, if any) and validated ``options``."""
        from_options = getattr(self.judge, "from_options", None)
        if from_options is not None:
            return from_options(engine, options)
        if not self.needs_engine:
            return self.judge(options)
        if engine is None:
            raise JudgeError(f"judge '{self.name}' asks a model; give it an engine (the target's, usually)")
        return self.judge(engine, options)


# Judges by name: each registers itself beside its class (:func:`judge`); importing
# stepspec.judges.registry imports every judge module, so the registry is full there.
JUDGES: Registry[JudgeEntry] = Registry("judge", JudgeError)

J = TypeVar("J", bound=type)


def judge(name: str, options: type[JudgeOptions], *, needs_engine: bool = True, about: str = ""
          ) -> Callable[[J], J]:
    """Register the decorated judge class as judge ``name`` with its options model; ``needs_engine``:
    it asks a model (built with the target's engine); ``about``: what it decides by. Example::

        @judge("exact", ExactOptions, needs_engine=False)
        class ExactJudge: ...
    """

    def register(cls: J) -> J:
        JUDGES.add(JudgeEntry(name, options, cls, needs_engine, about))
        return cls

    return register
