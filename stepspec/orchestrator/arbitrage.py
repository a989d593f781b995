"""``arbitrage`` and ``arbitrage-oracle``: a router decides who writes each step.

Arbitrage (2025): the draft writes the next step; a router predicts from what
the draft produced (its text and token logprobs, the trace so far) whether the
target would write a meaningfully better step, and only then asks the target.
Unlike ``specreason`` no judge call is spent on a kept step: the decision costs
a few milliseconds of features and a small classifier (:mod:`routers`).

``arbitrage-oracle`` is the upper bound for evaluation (and how training data
is collected): both models write every step from the same prefix, the judge
rates both, and the better one stays (a tie keeps the draft's).

As in ``specreason``, the target writes the first ``first_target_steps`` steps (default 2:
the opening and the plan) before the draft starts.

``backoff``: as in ``specreason``, the driver asks a governor shared by the problems in
flight, and the target writes the step when drafting does not pay at the measured load.

Worked example (router tau 0.4): the draft writes "16 - 3 = 13 eggs." with
p_target 0.12: kept (author "draft", score 0.12). It writes "13 - 4 = 8 eggs."
with p_target 0.71: routed; the target writes "13 - 4 = 9 eggs." (author
"target", draft_text keeps the draft's step, accepted False).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from stepspec.judges.base import Judge, JudgeError, Verdict
from stepspec.orchestrator.driver import Policy, StepBackoff, StrategyOptions, TargetOpening, Turn
from stepspec.orchestrator.registry import strategy
from stepspec.orchestrator.run import TraceRun, judged_fields
from stepspec.orchestrator.stepgen import GeneratedStep
from stepspec.orchestrator.trace import Author
from stepspec.routers.base import Action, Router, RoutingExample, RoutingState

# Top alternatives read per drafted token: enough for the entropy features.
ROUTER_LOGPROBS = 5


def routing_state(run: TraceRun, drafted: GeneratedStep) -> RoutingState:
    """What a router sees of the step ``drafted`` would add to ``run``'s trace."""
    return RoutingState(run.question, run.step_texts, tuple(s.author for s in run.steps), drafted.text,
                        drafted.token_logprobs, drafted.token_entropies, drafted.complete)


class ArbitrageOptions(StepBackoff, TargetOpening):
    """The target's opening steps, and backing off under load (as in ``specreason``)."""


@strategy("arbitrage", ArbitrageOptions, needs_router=True,
          writes="the draft; the target where a router routes the step")
class Arbitrage(Policy):
    def __init__(self, options: ArbitrageOptions, router: Router) -> None:
        self.router, self.options = router, options

    def turn(self, run: TraceRun) -> Turn:
        return Turn.OPENING if len(run.steps) < self.options.first_target_steps else Turn.GOVERNED

    async def step(self, run: TraceRun) -> None:
        if self.turn(run) is Turn.OPENING:  # the target's own
            run.keep(Author.TARGET, await run.write(Author.TARGET))
            return
        drafted = await run.write(Author.DRAFT, logprobs=ROUTER_LOGPROBS)
        t0 = time.perf_counter()
        with run.clock:  # the router's embedding model is a model call too
            (decision,) = await self.router.route([routing_state(run, drafted)])
        routed = judged_fields(drafted, Verdict(decision.router, decision.action == Action.KEEP, score=decision.p_target),
                               time.perf_counter() - t0)
        # Routing rule: a step the router keeps joins the trace as the draft wrote
        # it; a routed step is dropped and the target writes it from the same prefix;
        # "stop" drops it and the target writes the rest of the answer in one piece.
        if decision.action == Action.KEEP:
            run.keep(Author.DRAFT, drafted, **routed)
        elif decision.action == Action.STOP:
            await run.write_answer(Author.TARGET)
        else:
            run.keep(Author.TARGET, await run.write(Author.TARGET), **routed)


@strategy("arbitrage-oracle", default_judge="score",
          writes="both, every step; the judge keeps the better one (the upper bound)")
class ArbitrageOracle(Policy):
    """``on_example`` receives every position's pair of candidates and their ratings
    (what ``stepspec router collect`` records as training data, running this policy
    with :func:`stepspec.orchestrator.driver.drive`)."""

    def __init__(self, options: StrategyOptions, judge: Judge,
                 on_example: Callable[[RoutingExample], None] | None = None, problem_id: str = "") -> None:
        if judge.needs_target_step:
            raise JudgeError(f"arbitrage-oracle rates each candidate step on its own; judge '{judge.name}' "
                             "compares two steps and gives no rating: use 'score'")
        self.judge, self.on_example, self.problem_id = judge, on_example, problem_id

    async def step(self, run: TraceRun) -> None:
        cap = run.step_token_cap()
        drafted, own = await asyncio.gather(run.write(Author.DRAFT, cap=cap, logprobs=ROUTER_LOGPROBS),
                                            run.write(Author.TARGET, cap=cap))
        t0 = time.perf_counter()
        same = drafted.text == own.text  # both wrote the same step: one rating serves both
        rated = (drafted,) if same else (drafted, own)
        verdicts = await run.judge(self.judge, [run.rating(s.text, run.steps) for s in rated])
        v_draft, v_target = (verdicts[0], verdicts[0]) if same else verdicts
        q_draft, q_target = v_draft.score, v_target.score
        # Oracle rule: the target's step stays only when the judge rates it higher
        # than the draft's; a tie (or no rating for the target's) keeps the draft's,
        # the cheaper one. No rating for the draft's step keeps the target's.
        target_wins = q_target is not None and (q_draft is None or q_target > q_draft)
        fields = dict(draft_text=drafted.text, accepted=not target_wins, score=q_draft, target_score=q_target,
                      judge=v_draft.judge, num_draft_tokens=drafted.num_tokens, draft_seconds=drafted.seconds,
                      target_seconds=own.seconds, judge_seconds=time.perf_counter() - t0)
        if not target_wins:  # the target's step was written only to compare
            fields["num_verify_tokens"] = own.num_tokens
        if self.on_example is not None:
            self.on_example(RoutingExample(self.problem_id, routing_state(run, drafted), own.text, q_draft, q_target,
                                           drafted.num_tokens, own.num_tokens, v_draft.judge))
        run.keep(Author.TARGET if target_wins else Author.DRAFT, own if target_wins else drafted, **fields)
