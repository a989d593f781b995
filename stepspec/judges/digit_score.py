"""Read a 0-9 score from a next-token distribution (SpecReason's judge answer).

The judge prompt ends in a pre-filled ``Score:`` turn, so the target's next token
is the score itself; one prefill, no decoding. Only single-digit tokens count:
their logprobs are renormalized among themselves.

Worked example: top-k holds "7" (logprob -0.36), "8" (-1.20), "6" (-2.30) and
"The" (-4.0). Renormalized over the three digits: p = 0.635, 0.274, 0.091, so the
expected score is 0.635*7 + 0.274*8 + 0.091*6 = 7.18 and the argmax score is 7.
"""

from __future__ import annotations

import math
from typing import Literal

from stepspec.engine.types import NextTokenDistribution

ScoreMethod = Literal["expected", "argmax"]


def digit_probabilities(dist: NextTokenDistribution) -> dict[int, float]:
    """Probability of each digit 0-9 found in the top-k, renormalized over the digits."""
    logprobs: dict[int, float] = {}
    for text, lp in dist.by_text().items():
        if len(text) == 1 and text.isdigit():
            logprobs[int(text)] = lp
    if not logprobs:
        return {}
    top = max(logprobs.values())
    weights = {d: math.exp(lp - top) for d, lp in logprobs.items()}
    total = sum(weights.values())
    return {d: w / total for d, w in sorted(weights.items())}


def read_score(dist: NextTokenDistribution, method: ScoreMethod = "expected") -> float | None:
    """The judge's score, or None when no digit is among the top-k (the judge gave no score)."""
    probs = digit_probabilities(dist)
    if not probs:
        return None
    if method == "expected":
        return sum(d * p for d, p in probs.items())
    if method == "argmax":
        return float(max(probs, key=lambda d: (probs[d], -d)))
    raise ValueError(f"unknown score method '{method}'; choose 'expected' or 'argmax'")
