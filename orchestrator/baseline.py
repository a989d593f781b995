"""``target-only`` and ``draft-only``: one model writes every step.

The baselines every speculative strategy is measured against; they go through
the same step machinery, so their text is what a strategy produces when its
judge always sides with one model.
"""

from __future__ import annotations

from typing import Callable

from engine.protocol import Engine, EngineError
from orchestrator.run import Budget, ReasoningError, TraceRun, written_step
from orchestrator.stepgen import generate_steps, opening_prompt, step_prompt
from orchestrator.steps import StepRules
from orchestrator.trace import StepRecord, Trace


async def single_model(question: str, engine: Engine, author: str, *, rules: StepRules = StepRules(),
                       budget: Budget = Budget(), on_step: Callable[[StepRecord], None] | None = None) -> Trace:
    run = TraceRun(question, f"{author}-only", rules, budget, {author: engine}, on_step)
    model = run.engines[author]
    try:
        opening = opening_prompt(model, question)
        while (stop := run.stop_reason()) is None:
            (step,) = await generate_steps(model, [step_prompt(opening, run.steps, rules.delimiter)], rules,
                                           run.step_token_cap())
            run.add(written_step(len(run.steps), author, step), step.ends)
        if stop == "thinking":
            stop = await run.write_answer(author, opening)
    except EngineError as e:
        raise ReasoningError(f"{author}-only: {e}", run.finish("error", error=str(e))) from e
    return run.finish(stop)


async def target_only(question: str, *, target: Engine, **options) -> Trace:
    return await single_model(question, target, "target", **options)


async def draft_only(question: str, *, draft: Engine, target: Engine | None = None, **options) -> Trace:
    """The draft alone (``target`` is accepted, as every strategy gets one, and unused)."""
    return await single_model(question, draft, "draft", **options)
