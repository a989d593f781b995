"""``specreason``: the draft writes each step, a judge keeps it or the target rewrites it.

SpecReason (Pan et al., 2025): the small model drafts a reasoning step; the
large model scores it 0-9 in one token (the ``score`` judge, prefix-cached);
a step scored at or above the threshold stays, otherwise the large model
writes that step itself from the same prefix. The first ``first_target_steps``
steps are written by the target outright (the plan matters most).

Worked example, threshold 7: the draft writes "16 - 3 = 13 eggs." and the
target scores it 8.4: kept, author "draft". The draft writes "13 - 4 = 8
eggs." and scores 2.1: rejected; the target writes "13 - 4 = 9 eggs." from the
same prefix (author "target", draft_text keeps the rejected step).
"""

from __future__ import annotations

import time
from typing import Callable

from engine.protocol import Engine, EngineError
from judges.base import Judge, JudgeError, StepCandidate
from orchestrator.prompts import opening_messages
from orchestrator.run import Budget, ReasoningError, TraceRun, judged_fields, written_step
from orchestrator.stepgen import generate_steps, opening_prompt, step_prompt
from orchestrator.steps import StepRules
from orchestrator.trace import StepRecord, Trace


async def specreason(question: str, *, draft: Engine, target: Engine, judge: Judge,
                     rules: StepRules = StepRules(), budget: Budget = Budget(), first_target_steps: int = 0,
                     on_step: Callable[[StepRecord], None] | None = None) -> Trace:
    if judge.needs_target_step:
        raise JudgeError(
            f"specreason cannot use judge '{judge.name}': it compares with the target's step, and "
            "specreason asks the target only after a rejection; use 'score' (or the 'lookahead' strategy)"
        )
    if first_target_steps < 0:
        raise ValueError(f"first_target_steps must be >= 0, got {first_target_steps}")
    run = TraceRun(question, "specreason", rules, budget, {"draft": draft, "target": target}, on_step)
    draft, target, d = run.engines["draft"], run.engines["target"], rules.delimiter
    try:
        draft_opening, target_opening = opening_prompt(draft, question), opening_prompt(target, question)
        judge_opening = opening_messages(question)
        while (stop := run.stop_reason()) is None:
            cap = run.step_token_cap()
            if len(run.steps) < first_target_steps:
                (step,) = await generate_steps(target, [step_prompt(target_opening, run.steps, d)], rules, cap)
                run.add(written_step(len(run.steps), "target", step), step.ends)
                continue
            (drafted,) = await generate_steps(draft, [step_prompt(draft_opening, run.steps, d)], rules, cap)
            t0 = time.perf_counter()
            (verdict,) = await run.judge(judge, [StepCandidate(question, run.step_texts, drafted.text,
                                                               opening_messages=judge_opening)])
            judged = judged_fields(drafted, verdict, time.perf_counter() - t0)
            # Acceptance rule: a drafted step the judge accepts joins the trace as
            # written; a rejected one is discarded and the target writes this step
            # itself from the same prefix (the draft's text stays in the record).
            if verdict.accept:
                run.add(written_step(len(run.steps), "draft", drafted, **judged), drafted.ends)
            else:
                (own,) = await generate_steps(target, [step_prompt(target_opening, run.steps, d)], rules, cap)
                run.add(written_step(len(run.steps), "target", own, **judged), own.ends)
        if stop == "thinking":
            stop = await run.write_answer("target", target_opening)
    except EngineError as e:
        raise ReasoningError(f"specreason: {e}", run.finish("error", error=str(e))) from e
    return run.finish(stop)
