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

from typing import Callable, Sequence

from engine.protocol import Engine, EngineError
from judges.base import Verdict
from orchestrator.run import Budget, ReasoningError, TraceRun, judged_fields, written_step
from orchestrator.stepgen import generate_steps, opening_prompt, step_prompt
from orchestrator.steps import StepRules
from orchestrator.trace import StepRecord, Trace

DEFAULT_CUES = ("wait", "alternatively", "let me check", "let me verify", "hmm", "double-check", "but wait")
_LEAD = " \t\n*#>-_`"


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


async def spec_thinking(question: str, *, draft: Engine, target: Engine, rules: StepRules = StepRules(),
                        budget: Budget = Budget(), cues: Sequence[str] = DEFAULT_CUES, takeover_tokens: int = 128,
                        on_step: Callable[[StepRecord], None] | None = None) -> Trace:
    if takeover_tokens < 1:
        raise ValueError(f"takeover_tokens must be >= 1, got {takeover_tokens}")
    if isinstance(cues, str):
        cues = (cues,)
    run = TraceRun(question, "spec-thinking", rules, budget, {"draft": draft, "target": target}, on_step)
    draft, target, d = run.engines["draft"], run.engines["target"], rules.delimiter
    try:
        draft_opening, target_opening = opening_prompt(draft, question), opening_prompt(target, question)
        while (stop := run.stop_reason()) is None:
            (drafted,) = await generate_steps(draft, [step_prompt(draft_opening, run.steps, d)], rules,
                                              run.step_token_cap())
            cue = reflection_cue(drafted.text, cues)
            if cue is None:
                run.add(written_step(len(run.steps), "draft", drafted, draft_text=drafted.text, accepted=True),
                        drafted.ends)
                continue
            # Hand-over rule: the draft turned to reflect, so its step is dropped and
            # the target writes whole steps from the same prefix until it has written
            # takeover_tokens tokens; then the draft leads again.
            handed = judged_fields(drafted, Verdict(f"cue:{cue}", accept=False))
            num_written = 0
            while num_written < takeover_tokens and run.stop_reason() is None:
                (own,) = await generate_steps(target, [step_prompt(target_opening, run.steps, d)], rules,
                                              run.step_token_cap())
                run.add(written_step(len(run.steps), "target", own, **handed), own.ends)
                num_written += own.num_tokens
                handed = {}
        if stop == "thinking":
            stop = await run.write_answer("target", target_opening)
    except EngineError as e:
        raise ReasoningError(f"spec-thinking: {e}", run.finish("error", error=str(e))) from e
    return run.finish(stop)
