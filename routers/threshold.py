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
from typing import Sequence

from routers.base import KEEP, TARGET, Decision, RouterError, RoutingState


class ThresholdRouter:
    name = "threshold"

    def __init__(self, min_confidence: float = 0.6, statistic: str = "mean") -> None:
        if not 0 <= min_confidence <= 1:
            raise RouterError(f"threshold router: min_confidence must be within 0..1, got {min_confidence}")
        if statistic not in ("mean", "min"):
            raise RouterError(f"threshold router: unknown statistic '{statistic}'; choose 'mean' or 'min'")
        self.min_confidence = min_confidence
        self.statistic = statistic

    def confidence(self, state: RoutingState) -> float:
        lps = state.token_logprobs
        if not lps:
            raise RouterError("threshold router: the drafted step came without token logprobs; the strategy "
                              "must generate the draft's steps with logprobs (arbitrage does)")
        return math.exp(sum(lps) / len(lps) if self.statistic == "mean" else min(lps))

    async def route(self, states: Sequence[RoutingState]) -> list[Decision]:
        out = []
        for s in states:
            c = self.confidence(s)
            out.append(Decision(TARGET if c < self.min_confidence else KEEP, 1.0 - c, self.name))
        return out
