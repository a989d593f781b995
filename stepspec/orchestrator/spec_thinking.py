"""``spec-thinking``: the draft leads; the target takes over where the draft reflects.

Speculative Thinking (Yang et al., 2025): a small model reasons well enough
step to step but reflects poorly. When a drafted step opens with a reflection
cue ("Wait", "Alternatively", "Let me check", ...), that step is discarded and
the target writes from there: whole steps, until it has written at least
``takeover_tokens`` tokens (or the trace ends); then the draft leads again.

Worked example, takeover_tokens 60: the draft writes "16 - 3 - 4 = 9 eggs." (kept),
then "Wait, she also bakes muffins." (opens with "wait": discarded). The target
writes "She bakes with 4 of the 16 eggs." (25 tokens) and "So 9 are sold at
$2: 9 * 2 = 18." (38 tokens, 63 in all): the draft leads again from there.
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic import Field, field_validator

from stepspec.judges.base import Verdict
from stepspec.orchestrator.driver import Policy, StrategyOptions
from stepspec.orchestrator.registry import strategy
from stepspec.orchestrator.run import TraceRun, judged_fields
from stepspec.orchestrator.trace import Author

DEFAULT_CUES = ("wait", "alternatively", "let me check", "let me verify", "hmm", "double-check", "but wait")
_LEAD = " \t\n*#>-_`"


class SpecThinkingOptions(StrategyOptions):
    cues: tuple[str, ...] = Field(DEFAULT_CUES, description="a drafted step opening with one of these hands over "
                                                            "to the target ('' matches every step)")
    takeover_tokens: int = Field(128, ge=1, description="tokens the target writes before the draft leads again")

    @field_validator("cues", mode="before")
    @classmethod
    def _one_cue(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value


def reflection_cue(step: str, cues: Sequence[str]) -> str | None:
    """The cue ``step`` opens with (case-insensitive, after markdown and list
    numbering, on a word boundary), or None. The empty cue "" matches every step."""
    text = step.lstrip(_LEAD)
    head = text.split(maxsplit=1)
    if head and head[0].rstrip(".)").isdigit():  # "2. Wait, ..." -> "Wait, ..."
        text = head[1].lstrip(_LEAD) if len(head) > 1 else ""
    lowered = text.lower()
    for cue in cues:
        c = cue.lower()
        if lowered.startswith(c) and (not c or len(lowered) == len(c) or not lowered[len(c)].isalnum()):
            return cue
    return None


@strategy("spec-thinking", SpecThinkingOptions,
          writes='the draft; the target after a reflection cue ("Wait", ...)')
class SpecThinking(Policy):
    async def step(self, run: TraceRun) -> None:
        drafted = await run.write(Author.DRAFT)
        cue = reflection_cue(drafted.text, self.options.cues)
        if cue is None:
            run.keep(Author.DRAFT, drafted, draft_text=drafted.text, accepted=True)
            return
        # Hand-over rule: the draft turned to reflect, so its step is dropped and
        # the target writes whole steps from the same prefix until it has written
        # takeover_tokens tokens; then the draft leads again.
        handed = judged_fields(drafted, Verdict(f"cue:{cue}", accept=False))
        num_written = 0
        while num_written < self.options.takeover_tokens and run.stop_reason() is None:
            own = await run.write(Author.TARGET)
            run.keep(Author.TARGET, own, **handed)
            num_written += own.num_tokens
            handed = {}
