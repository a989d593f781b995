"""``specreason``: the draft writes each step, a judge keeps it or the target rewrites it.

SpecReason (Pan et al., 2025): the small model drafts a reasoning step; the
large model scores it 0-9 in one token (the ``score`` judge, prefix-cached);
a step scored at or above the threshold stays, otherwise the large model
writes that step itself from the same prefix. The first ``first_target_steps``
steps are written by the target outright (default 2: the opening and the plan).

Why 2: a drafted plan whose every token the target finds plausible can still be the
wrong plan, and the target then follows it (GSM8K #0: "1. Calculate the number of eggs
Janet eats" leads the 1.5B itself to 16 - 3 = 13). Chosen on GSM8K test problems
100-129 (not the bench's), all at once, likelihood judge at its defaults:
target-only 19/30; drafting from the first step 17/30 (4 lost, 2 gained), the target
writing 31% of the tokens; the target writing the first two steps 19/30 (3 lost, 3
gained), the target writing 47% (benchmarks/measured/likelihood_defaults_gsm8k100-129).

Worked example, threshold 7: the draft writes "16 - 3 = 13 eggs." and the
target scores it 8.4: kept, author "draft". The draft writes "13 - 4 = 8
eggs." and scores 2.1: rejected; the target writes "13 - 4 = 9 eggs." from the
same prefix (author "target", draft_text keeps the rejected step).

With the ``likelihood`` judge (a token-level verifier) a rejection is partial:
the drafted tokens before its cut stay, and the target writes the step on from
the cut (``num_kept_tokens`` and ``cut`` in the step's record).

``backoff`` (goodput-aware speculation, :mod:`orchestrator.goodput`): before each
step a governor shared by all problems in flight compares the measured seconds
per token of drafted and target-written steps at the current load, and lets the
target write the step when drafting does not pay (``backoff=True`` in its record).
"""

from __future__ import annotations

import time
from typing import Callable

from engine.protocol import Engine, EngineError
from judges.base import Judge, JudgeError
from orchestrator.goodput import GoodputGovernor, StepMode
from orchestrator.prompts import opening_messages
from orchestrator.run import (Budget, ReasoningError, TraceRun, draft_logprobs, drafted_candidate, judged_fields,
                              rewrite_step, written_step)
from orchestrator.stepgen import generate_steps, opening_prompt, step_prompt
from orchestrator.steps import StepRules
from orchestrator.trace import StepRecord, Trace


async def specreason(question: str, *, draft: Engine, target: Engine, judge: Judge,
                     rules: StepRules = StepRules(), budget: Budget = Budget(), first_target_steps: int = 2,
                     backoff: bool = True, governor: GoodputGovernor | None = None,
                     on_step: Callable[[StepRecord], None] | None = None) -> Trace:
    if judge.needs_target_step:
        raise JudgeError(
            f"specreason cannot use judge '{judge.name}': it compares with the target's step, and "
            "specreason asks the target only after a rejection; use 'score' or 'likelihood' (or the 'lookahead' "
            "strategy)"
        )
    if first_target_steps < 0:
        raise ValueError(f"first_target_steps must be >= 0, got {first_target_steps}")
    governor = (governor or GoodputGovernor()) if backoff else None
    run = TraceRun(question, "specreason", rules, budget, {"draft": draft, "target": target}, on_step, governor)
    draft, target, d = run.engines["draft"], run.engines["target"], rules.delimiter
    try:
        draft_opening, target_opening = opening_prompt(draft, question), opening_prompt(target, question)
        judge_opening = opening_messages(question)
        while (stop := run.stop_reason()) is None:
            cap, prompt = run.step_token_cap(), step_prompt(target_opening, run.steps, d)
            mode = run.decide()  # goodput: at this load, does drafting pay?
            if len(run.steps) < first_target_steps or mode is StepMode.TARGET:
                (step,) = await generate_steps(target, [prompt], rules, cap)
                run.add(written_step(len(run.steps), "target", step, backoff=mode is StepMode.TARGET), step.ends)
                continue
            (drafted,) = await generate_steps(draft, [step_prompt(draft_opening, run.steps, d)], rules, cap,
                                              logprobs=draft_logprobs(judge))
            t0 = time.perf_counter()
            (verdict,) = await run.judge(judge, [drafted_candidate(question, run.steps, drafted, opening=judge_opening,
                                                                   prefix=prompt)])
            judged = judged_fields(drafted, verdict, time.perf_counter() - t0)
            # Acceptance rule: a drafted step the judge accepts joins the trace as written;
            # a rejected one is rewritten by the target from the same prefix, after the
            # drafted tokens a token-level verifier kept before its cut (if it cut one).
            if verdict.accept:
                run.add(written_step(len(run.steps), "draft", drafted, **judged), drafted.ends)
            else:
                own = await rewrite_step(target, prompt, verdict, rules, cap)
                run.add(written_step(len(run.steps), "target", own, **judged), own.ends)
        if stop == "thinking":
            stop = await run.write_answer("target", target_opening)
    except EngineError as e:
        raise ReasoningError(f"specreason: {e}", run.finish("error", error=str(e))) from e
    return run.finish(stop)
