"""``arbitrage`` and ``arbitrage-oracle``: a router decides who writes each step.

Arbitrage (2025): the draft writes the next step; a router predicts from what
the draft produced (its text and token logprobs, the trace so far) whether the
target would write a meaningfully better step, and only then asks the target.
Unlike ``specreason`` no judge call is spent on a kept step: the decision costs
a few milliseconds of features and a small classifier (:mod:`routers`).

``arbitrage-oracle`` is the upper bound for evaluation (and how training data
is collected): both models write every step from the same prefix, the judge
rates both, and the better one stays (a tie keeps the draft's).

Worked example (router tau 0.4): the draft writes "16 - 3 = 13 eggs." with
p_target 0.12: kept (author "draft", score 0.12). It writes "13 - 4 = 8 eggs."
with p_target 0.71: routed; the target writes "13 - 4 = 9 eggs." (author
"target", draft_text keeps the draft's step, accepted False).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from engine.protocol import Engine, EngineError
from judges.base import Judge, JudgeError, StepCandidate, Verdict
from orchestrator.prompts import opening_messages
from orchestrator.run import Budget, ReasoningError, TraceRun, judged_fields, written_step
from orchestrator.stepgen import GeneratedStep, generate_steps, opening_prompt, step_prompt
from orchestrator.steps import StepRules
from orchestrator.trace import StepRecord, Trace
from routers.base import KEEP, STOP, Router, RoutingExample, RoutingState

# Top alternatives read per drafted token: enough for the entropy features.
ROUTER_LOGPROBS = 5


def routing_state(run: TraceRun, drafted: GeneratedStep) -> RoutingState:
    """What a router sees of the step ``drafted`` would add to ``run``'s trace."""
    return RoutingState(run.question, run.step_texts, tuple(s.author for s in run.steps), drafted.text,
                        drafted.token_logprobs, drafted.token_entropies, drafted.complete)


async def arbitrage(question: str, *, draft: Engine, target: Engine, router: Router, rules: StepRules = StepRules(),
                    budget: Budget = Budget(), first_target_steps: int = 0,
                    on_step: Callable[[StepRecord], None] | None = None) -> Trace:
    if first_target_steps < 0:
        raise ValueError(f"first_target_steps must be >= 0, got {first_target_steps}")
    run = TraceRun(question, "arbitrage", rules, budget, {"draft": draft, "target": target}, on_step)
    draft, target, d = run.engines["draft"], run.engines["target"], rules.delimiter
    try:
        draft_opening, target_opening = opening_prompt(draft, question), opening_prompt(target, question)
        while (stop := run.stop_reason()) is None:
            cap = run.step_token_cap()
            if len(run.steps) < first_target_steps:
                (step,) = await generate_steps(target, [step_prompt(target_opening, run.steps, d)], rules, cap)
                run.add(written_step(len(run.steps), "target", step), step.ends)
                continue
            (drafted,) = await generate_steps(draft, [step_prompt(draft_opening, run.steps, d)], rules, cap,
                                              logprobs=ROUTER_LOGPROBS)
            t0 = time.perf_counter()
            with run.clock:  # the router's embedding model is a model call too
                (decision,) = await router.route([routing_state(run, drafted)])
            routed = judged_fields(drafted, Verdict(decision.router, decision.action == KEEP, score=decision.p_target),
                                   time.perf_counter() - t0)
            # Routing rule: a step the router keeps joins the trace as the draft wrote
            # it; a routed step is dropped and the target writes it from the same prefix;
            # "stop" drops it and the target writes the rest of the answer in one piece.
            if decision.action == KEEP:
                run.add(written_step(len(run.steps), "draft", drafted, **routed), drafted.ends)
            elif decision.action == STOP:
                stop = await run.write_answer("target", target_opening)
                break
            else:
                (own,) = await generate_steps(target, [step_prompt(target_opening, run.steps, d)], rules, cap)
                run.add(written_step(len(run.steps), "target", own, **routed), own.ends)
        if stop == "thinking":
            stop = await run.write_answer("target", target_opening)
    except EngineError as e:
        raise ReasoningError(f"arbitrage: {e}", run.finish("error", error=str(e))) from e
    return run.finish(stop)


async def arbitrage_oracle(question: str, *, draft: Engine, target: Engine, judge: Judge,
                           rules: StepRules = StepRules(), budget: Budget = Budget(),
                           on_step: Callable[[StepRecord], None] | None = None,
                           on_example: Callable[[RoutingExample], None] | None = None,
                           problem_id: str = "") -> Trace:
    """``on_example`` receives every position's pair of candidates and their
    ratings (what ``stepspec router collect`` records as training data)."""
    if judge.needs_target_step:
        raise JudgeError(f"arbitrage-oracle rates each candidate step on its own; judge '{judge.name}' compares "
                         "two steps and gives no rating: use 'score'")
    run = TraceRun(question, "arbitrage-oracle", rules, budget, {"draft": draft, "target": target}, on_step)
    draft, target, d = run.engines["draft"], run.engines["target"], rules.delimiter
    try:
        draft_opening, target_opening = opening_prompt(draft, question), opening_prompt(target, question)
        judge_opening = opening_messages(question)
        while (stop := run.stop_reason()) is None:
            cap = run.step_token_cap()
            (drafted,), (own,) = await asyncio.gather(
                generate_steps(draft, [step_prompt(draft_opening, run.steps, d)], rules, cap,
                               logprobs=ROUTER_LOGPROBS),
                generate_steps(target, [step_prompt(target_opening, run.steps, d)], rules, cap))
            t0 = time.perf_counter()
            same = drafted.text == own.text  # both wrote the same step: one rating serves both
            rate = [StepCandidate(question, run.step_texts, step.text, opening_messages=judge_opening)
                    for step in ((drafted,) if same else (drafted, own))]
            verdicts = await run.judge(judge, rate)
            v_draft, v_target = (verdicts[0], verdicts[0]) if same else verdicts
            q_draft, q_target = v_draft.score, v_target.score
            # Oracle rule: the target's step stays only when the judge rates it higher
            # than the draft's; a tie (or no rating for the target's) keeps the draft's,
            # the cheaper one. No rating for the draft's step keeps the target's.
            target_wins = q_target is not None and (q_draft is None or q_target > q_draft)
            chosen = own if target_wins else drafted
            fields = dict(draft_text=drafted.text, accepted=not target_wins, score=q_draft, target_score=q_target,
                          judge=v_draft.judge, num_draft_tokens=drafted.num_tokens, draft_seconds=drafted.seconds,
                          target_seconds=own.seconds, judge_seconds=time.perf_counter() - t0)
            if target_wins:
                fields["num_target_tokens"] = own.num_tokens
            else:
                fields["num_verify_tokens"] = own.num_tokens
            if on_example is not None:
                on_example(RoutingExample(problem_id, routing_state(run, drafted), own.text, q_draft, q_target,
                                          drafted.num_tokens, own.num_tokens, v_draft.judge))
            run.add(written_step(len(run.steps), "target" if target_wins else "draft", chosen, **fields),
                    chosen.ends)
        if stop == "thinking":
            stop = await run.write_answer("target", target_opening)
    except EngineError as e:
        raise ReasoningError(f"arbitrage-oracle: {e}", run.finish("error", error=str(e))) from e
    return run.finish(stop)
