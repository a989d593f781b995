"""``threshold``: route on the draft's own confidence in its step.

Confidence is the draft's geometric-mean token probability over the step,
exp(mean token logprob) (``statistic="mean"``), or the probability of its least
likely token (``"min"``). A step written with confidence below
``min_confidence`` goes to the target. The simplest router, and the one a
learned router has to beat.

Worked example, min_confidence 0.6: a step of three tokens written with
probabilities 0.9, 0.8 and 0.3 has mean logprob -0.51, confidence 0.60: kept;
with ``"min"`` its confidence is 0.3: routed to the target.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal, Sequence

from pydantic import Field

from stepspec.common.options import Configured
from stepspec.routers.base import Action, Decision, RouterError, RouterOptions, RoutingState, router


class ThresholdOptions(RouterOptions):
    owner: ClassVar[str] = "router 'threshold'"

    min_confidence: float = Field(0.6, ge=0, le=1, description="a step the draft wrote with confidence below "
                                  "this goes to the target")
    statistic: Literal["mean", "min"] = Field("mean", description="the draft's confidence in its step: 'mean' "
                                              "(geometric-mean token probability) or 'min' (its least likely token's)")


@router("threshold", ThresholdOptions,
       about="the draft's own confidence in its step (its tokens' probabilities)")
class ThresholdRouter(Configured):
    name = "threshold"

    def __init__(self, options: ThresholdOptions | None = None, **overrides) -> None:
        """``options``, or keywords (``min_confidence=0.5``) validated through :class:`ThresholdOptions`."""
        self.options = ThresholdOptions.build(options, **overrides)

    def confidence(self, state: RoutingState) -> float:
        lps = state.token_logprobs
        if not lps:
            raise RouterError("threshold router: the drafted step came without token logprobs; the strategy "
                              "must generate the draft's steps with logprobs (arbitrage does)")
        return math.exp(sum(lps) / len(lps) if self.options.statistic == "mean" else min(lps))

    async def route(self, states: Sequence[RoutingState]) -> list[Decision]:
        out = []
        for s in states:
            c = self.confidence(s)
            out.append(Decision(Action.TARGET if c < self.options.min_confidence else Action.KEEP, 1.0 - c, self.name))
        return out
