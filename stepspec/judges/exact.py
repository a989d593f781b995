"""``exact``: normalized string equality of the draft's and the target's step."""

from __future__ import annotations

import re
import unicodedata
from typing import ClassVar, Sequence

from stepspec.common.options import Configured
from stepspec.judges.base import JudgeOptions, StepCandidate, Verdict, judge, require_target_steps

_SPACE = re.compile(r"\s+")
_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def normalize_step(text: str) -> str:
    """Case, Unicode form, whitespace and trailing punctuation do not matter."""
    text = unicodedata.normalize("NFKC", text).lower().strip()
    text = _SPACE.sub(" ", text)
    return text.rstrip(" .;:,")


def numbers_in(text: str) -> list[str]:
    """The numbers a step states, in order, thousands separators and trailing dots dropped."""
    out = []
    for m in _NUMBER.findall(text):
        n = m.replace(",", "").rstrip(".")
        if "." in n:
            n = n.rstrip("0").rstrip(".")
        if n and n != "-":
            out.append(n)
    return out


class ExactOptions(JudgeOptions):
    """None: the comparison has nothing to set."""

    owner: ClassVar[str] = "judge 'exact'"


@judge("exact", ExactOptions, needs_engine=False,
       about="the drafted and the target's step are the same text, normalized")
class ExactJudge(Configured):
    """Accepts equal steps for sure; unequal steps are rejected, but not confidently
    (different words may say the same thing), so a cascade escalates them."""

    name = "exact"
    needs_target_step = True
    needs_draft_tokens = False  # verdicts need no drafted token ids and logprobs
    draft_top_k = 0

    def __init__(self, options: ExactOptions | None = None, **overrides) -> None:
        self.options = ExactOptions.build(options, **overrides)

    async def judge(self, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        require_target_steps(self.name, candidates)
        verdicts = []
        for c in candidates:
            same = normalize_step(c.draft_step) == normalize_step(c.target_step)
            verdicts.append(Verdict(self.name, accept=same, confident=same, score=1.0 if same else 0.0))
        return verdicts
