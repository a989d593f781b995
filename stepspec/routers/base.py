"""The router protocol: who writes the next reasoning step.

A router sees the reasoning state after the draft has written the next step
(the problem, the steps so far and who wrote each, the drafted step and the
draft's token logprobs) and decides before the target does any work:

* ``keep``: the drafted step joins the trace;
* ``target``: the drafted step is dropped and the target writes this step;
* ``stop``: stop stepping; the drafted step is dropped and the target writes
  the rest of the answer in one piece (a router that sees the draft going in
  circles hands the ending to the target).

Each decision carries ``p_target``, the router's probability that the target's
step would be meaningfully better than the draft's.

Terms used in training (:mod:`stepspec.routers.train`):

* quality: a judge's rating of one candidate step in its context (default the
  target's 0-9 self-score, :class:`stepspec.judges.score.ScoreJudge`);
* advantage: target quality minus draft quality at the same position;
* label ``advantage``: advantage > margin ("the target's step is meaningfully
  better", by the judge's ratings);
* label ``verifier`` (the default): the target's likelihood verifier
  (:class:`stepspec.judges.likelihood.LikelihoodJudge`, typed rules) cut the drafted step:
  one of its tokens is implausible to the target, so ``specreason`` with that
  judge would have sent the step to the target. ``stepspec router verify``
  scores every collected step once (one prefill each) and records the verdict.

Worked example, margin 0.5: at step 3 the draft writes "13 - 4 = 8 eggs." and
the target "13 - 4 = 9 eggs."; the judge rates them 4.1 and 8.7: advantage
4.6, label 1. A router that gives p_target 0.82 at tau 0.4 routes the step to
the target (action ``target``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Callable, ClassVar, Protocol, Sequence, TypeVar, runtime_checkable

from stepspec.common.options import Options
from stepspec.common.registry import Entry, Registry

class Action(StrEnum):
    """What a router decides about a drafted step."""

    KEEP = "keep"  # the drafted step stays
    TARGET = "target"  # the target writes the step instead
    STOP = "stop"  # the trace ends here


class RouterError(ValueError):
    """A router file or option is unusable; the message names the problem and the fix."""


class RouterOptions(Options):
    """Base of each router's options model: frozen, unknown options refused, a mistake
    raised as :class:`RouterError`."""

    error: ClassVar[type[Exception]] = RouterError


@dataclass(frozen=True)
class RoutingState:
    """What a router sees about the next step (step level; tokens only as the draft's logprobs)."""

    question: str
    previous_steps: tuple[str, ...]
    previous_authors: tuple[str, ...]  # "draft" or "target", one per previous step
    draft_step: str
    # Per token of the drafted step: the draft's logprob of the token it wrote and
    # the top-k entropy of its next-token distribution (nats).
    token_logprobs: tuple[float, ...] = ()
    token_entropies: tuple[float, ...] = ()
    complete: bool = True  # False: the drafted step was cut by the per-step token cap

    def __post_init__(self) -> None:
        if len(self.previous_authors) != len(self.previous_steps):
            raise ValueError(f"{len(self.previous_steps)} previous steps but {len(self.previous_authors)} authors")
        if len(self.token_entropies) not in (0, len(self.token_logprobs)):
            raise ValueError("token_entropies must be empty or one per token logprob")

    @property
    def position(self) -> int:
        return len(self.previous_steps)


@dataclass(frozen=True)
class Decision:
    action: Action
    p_target: float
    router: str

    def __post_init__(self) -> None:
        if self.action not in tuple(Action):
            raise ValueError(f"unknown routing action '{self.action}'; one of {', '.join(Action)}")
        object.__setattr__(self, "action", Action(self.action))


@runtime_checkable
class Router(Protocol):
    name: str

    async def route(self, states: Sequence[RoutingState]) -> list[Decision]:
        """One decision per state, in order."""
        ...


@dataclass(frozen=True)
class RouterEntry(Entry):
    """A registered router: its class, built as ``router(options)`` from validated options."""

    router: Callable[[Any], Router] = field(default=None, repr=False)  # type: ignore[assignment]
    about: str = ""  # what it routes by, in a few words (the docs' router table)


# Routers by name: each registers itself beside its class (:func:`router`); importing
# stepspec.routers.registry imports every router module, so the registry is full there. A
# trained router is a file, not a name (stepspec.routers.registry.make_router reads it).
ROUTERS: Registry[RouterEntry] = Registry("router", RouterError, hint="Give 'threshold' or the path of a router file "
                                                                    "(train one with `stepspec router train`)")

R = TypeVar("R", bound=type)


def router(name: str, options: type[RouterOptions], *, about: str = "") -> Callable[[R], R]:
    """Register the decorated router class as router ``name`` with its options model; ``about``:
    what it routes by. Example::

        @router("threshold", ThresholdOptions)
        class ThresholdRouter: ...
    """

    def register(cls: R) -> R:
        ROUTERS.add(RouterEntry(name, options, cls, about))
        return cls

    return register


@dataclass(frozen=True)
class RoutingExample:
    """One collected step: both candidates at the same position and their quality."""

    problem_id: str
    state: RoutingState  # the draft's candidate is state.draft_step
    target_step: str
    draft_quality: float | None  # None: the judge gave no rating
    target_quality: float | None
    num_draft_tokens: int
    num_target_tokens: int
    judge: str
    # The likelihood verifier's verdict on the drafted step (``stepspec router verify``):
    # whether it cut the step, and the share of its tokens the target found plausible.
    # None: not verified.
    verifier_cut: bool | None = None
    verifier_plausible: float | None = None

    @property
    def advantage(self) -> float | None:
        if self.draft_quality is None or self.target_quality is None:
            return None
        return self.target_quality - self.draft_quality

    def to_dict(self) -> dict[str, Any]:
        """The record as collected (``advantage`` included, for people reading the file)."""
        return {**asdict(self), "advantage": self.advantage}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RoutingExample":
        data = {k: v for k, v in data.items() if k != "advantage"}  # derived, not stored state
        state = data["state"]
        state = RoutingState(**{k: tuple(v) if isinstance(v, list) else v for k, v in state.items()})
        return cls(**{**data, "state": state})


@dataclass(frozen=True)
class VerifiedStep:
    """The likelihood verifier's verdict on one collected drafted step, a line of a
    collection's ``verdicts.jsonl`` (``stepspec router verify``): whether it cut the step,
    the share of the step's tokens the target found plausible, and where the cut fell
    (token offset, the token's text and the target's logprob of it)."""

    problem_id: str
    position: int
    cut: bool
    plausible: float
    cut_offset: int | None = None
    cut_token: str | None = None
    cut_logprob: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "VerifiedStep":
        return cls(**data)
