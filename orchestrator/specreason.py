"""``specreason``: the draft writes each step, a judge keeps it or the target rewrites it.

SpecReason (Pan et al., 2025): the small model drafts a reasoning step; the
large model scores it 0-9 in one token (the ``score`` judge, prefix-cached);
a step scored at or above the threshold stays, otherwise the large model
writes that step itself from the same prefix. The first ``first_target_steps``
steps are written by the target outright (the plan matters most).
"""

from __future__ import annotations

import time

from engine.protocol import Engine, EngineError
from judges.base import Judge, JudgeError, StepCandidate
from orchestrator.prompts import opening_messages
from orchestrator.run import Budget, ReasoningError, TraceRun
from orchestrator.stepgen import generate_steps, opening_prompt, step_prompt
from orchestrator.steps import StepRules
from orchestrator.trace import StepRecord, Trace


async def specreason(question: str, *, draft: Engine, target: Engine, judge: Judge,
                     rules: StepRules = StepRules(), budget: Budget = Budget(),
                     first_target_steps: int = 0) -> Trace:
    if judge.needs_target_step:
        raise JudgeError(
            f"specreason cannot use judge '{judge.name}': it compares with the target's step, and "
            "specreason asks the target only after a rejection; use 'score' (or 'lookahead')"
        )
    run = TraceRun(question, "specreason", rules, budget, {"draft": draft, "target": target})
    d = rules.delimiter
    try:
        draft_opening, target_opening = opening_prompt(draft, question), opening_prompt(target, question)
        judge_opening = opening_messages(question)
        while (stop := run.stop_reason()) is None:
            cap = run.step_token_cap()
            if len(run.steps) < first_target_steps:
                (step,) = await generate_steps(target, [step_prompt(target_opening, run.steps, d)], rules, cap)
                run.add(StepRecord(len(run.steps), "target", step.text, complete=step.complete,
                                   num_target_tokens=step.num_tokens, target_seconds=step.seconds), step.ends_trace)
                continue
            (drafted,) = await generate_steps(draft, [step_prompt(draft_opening, run.steps, d)], rules, cap)
            t0 = time.perf_counter()
            (verdict,) = await judge.judge([StepCandidate(question, run.step_texts, drafted.text,
                                                          opening_messages=judge_opening)])
            judged = dict(draft_text=drafted.text, accepted=verdict.accept, score=verdict.score,
                          judge=verdict.judge, num_draft_tokens=drafted.num_tokens, draft_seconds=drafted.seconds,
                          judge_seconds=time.perf_counter() - t0)
            # Acceptance rule: a drafted step the judge accepts joins the trace as
            # written; a rejected one is discarded and the target writes this step
            # itself from the same prefix (the draft's text stays in the record).
            if verdict.accept:
                run.add(StepRecord(len(run.steps), "draft", drafted.text, complete=drafted.complete, **judged),
                        drafted.ends_trace)
            else:
                (own,) = await generate_steps(target, [step_prompt(target_opening, run.steps, d)], rules, cap)
                run.add(StepRecord(len(run.steps), "target", own.text, complete=own.complete,
                                   num_target_tokens=own.num_tokens, target_seconds=own.seconds, **judged),
                        own.ends_trace)
    except EngineError as e:
        raise ReasoningError(f"specreason: {e}", run.finish("error", error=str(e))) from e
    return run.finish(stop)
