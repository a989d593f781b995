"""``target-only`` and ``draft-only``: one model writes every step.

The baselines every speculative strategy is measured against; they go through
the same step machinery, so their text is what a strategy produces when its
judge always sides with one model.
"""

from __future__ import annotations

from engine.protocol import Engine, EngineError
from orchestrator.run import Budget, ReasoningError, TraceRun
from orchestrator.stepgen import generate_steps, opening_prompt, step_prompt
from orchestrator.steps import StepRules
from orchestrator.trace import StepRecord, Trace


async def single_model(question: str, engine: Engine, author: str, *, rules: StepRules = StepRules(),
                       budget: Budget = Budget()) -> Trace:
    run = TraceRun(question, f"{author}-only", rules, budget, {author: engine})
    try:
        opening = opening_prompt(engine, question)
        while (stop := run.stop_reason()) is None:
            prompt = step_prompt(opening, run.steps, rules.delimiter)
            (step,) = await generate_steps(engine, [prompt], rules, run.step_token_cap())
            tokens = {"num_draft_tokens" if author == "draft" else "num_target_tokens": step.num_tokens}
            seconds = {"draft_seconds" if author == "draft" else "target_seconds": step.seconds}
            run.add(StepRecord(len(run.steps), author, step.text, complete=step.complete, **tokens, **seconds),
                    step.ends_trace)
    except EngineError as e:
        raise ReasoningError(f"{author}-only: {e}", run.finish("error", error=str(e))) from e
    return run.finish(stop)


async def target_only(question: str, *, target: Engine, **options) -> Trace:
    return await single_model(question, target, "target", **options)


async def draft_only(question: str, *, draft: Engine, **options) -> Trace:
    return await single_model(question, draft, "draft", **options)
