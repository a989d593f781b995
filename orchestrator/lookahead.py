"""``lookahead``: the draft writes γ steps ahead, the target checks them in one batch.

Lookahead Reasoning (Fu et al., 2025). One round, from the trace so far P:

1. the draft writes steps d1..dγ one after another (each continues the last);
2. the target writes its own step at every drafted position in one batched
   call: t1 after P, t2 after P+d1, ..., tγ after P+d1..d(γ-1);
3. a judge compares each di with ti; the longest prefix of accepted drafts is
   kept and, at the first rejected position, the target's ti takes its place.

Worked example, γ = 3: the judge accepts d1, rejects d2 (d3 is never looked
at). The trace grows by d1 then t2 (author "target", draft_text d2); d3 and t3
are discarded work, counted in the trace's ``num_generated_tokens``.

Overlap: while the target and the judge work on a round, the draft already
writes the next round's steps after d1..dγ, betting that all are accepted. A
rejection cancels that work in flight (vLLM aborts its requests). Draft and
target are separate vLLM engines, so the two run at the same time.

γ adapts (``adaptive=True``) to the running step acceptance rate a: a run of
accepted drafts is a/(1-a) steps long on average, so the next round drafts
round(a/(1-a)) + 1 steps, within [min_gamma, max_gamma].

With a token-level verifier (``likelihood``) the target writes no step of its own
in step 2: it prefills the γ drafted steps in one batch instead, and a rejected
step keeps its drafted tokens before the cut, the target writing the rest.
``backoff``: as in ``specreason``, the target writes a round's step outright when
the measured load says drafting does not pay (:mod:`orchestrator.goodput`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from engine.protocol import Engine, EngineError
from judges.base import Judge
from orchestrator.goodput import GoodputGovernor, StepMode
from orchestrator.prompts import opening_messages
from orchestrator.run import (Budget, ReasoningError, TraceRun, draft_logprobs, drafted_candidate, judged_fields,
                              rewrite_step, written_step)
from orchestrator.stepgen import GeneratedStep, generate_steps, opening_prompt, step_prompt
from orchestrator.steps import StepRules
from orchestrator.trace import StepRecord, Trace


@dataclass
class GammaController:
    """How many steps to draft ahead, from the running step acceptance rate."""

    gamma: int = 4
    min_gamma: int = 1
    max_gamma: int = 8
    adaptive: bool = True
    smoothing: float = 0.5  # weight of the newest round in the running rate
    acceptance_rate: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_gamma <= self.gamma <= self.max_gamma:
            raise ValueError(f"lookahead needs 1 <= min_gamma ({self.min_gamma}) <= gamma ({self.gamma}) "
                             f"<= max_gamma ({self.max_gamma})")

    def observe_round(self, num_accepted: int, num_judged: int) -> None:
        """One round's verdicts: ``num_accepted`` of the first ``num_judged`` positions
        (the judged prefix up to and including the first rejection)."""
        if not self.adaptive or num_judged == 0:
            return
        rate = num_accepted / num_judged
        a = rate if self.acceptance_rate is None else (
            self.smoothing * rate + (1 - self.smoothing) * self.acceptance_rate)
        self.acceptance_rate = a
        expected_run = a / (1 - a) if a < 1 else float(self.max_gamma)
        self.gamma = max(self.min_gamma, min(self.max_gamma, round(expected_run) + 1))


async def lookahead(question: str, *, draft: Engine, target: Engine, judge: Judge,
                    rules: StepRules = StepRules(), budget: Budget = Budget(), gamma: int = 4,
                    min_gamma: int = 1, max_gamma: int = 8, adaptive: bool = True, backoff: bool = True,
                    governor: GoodputGovernor | None = None,
                    on_step: Callable[[StepRecord], None] | None = None) -> Trace:
    control = GammaController(gamma, min_gamma, max_gamma, adaptive)
    governor = (governor or GoodputGovernor()) if backoff else None
    run = TraceRun(question, "lookahead", rules, budget, {"draft": draft, "target": target}, on_step, governor)
    draft, target, d = run.engines["draft"], run.engines["target"], rules.delimiter
    logprobs = draft_logprobs(judge)

    async def draft_ahead(base: list[StepRecord], num_steps: int) -> list[GeneratedStep]:
        """Up to ``num_steps`` drafted steps after ``base``, stopping where the trace would."""
        drafted: list[GeneratedStep] = []
        ahead = base[len(run.steps):]
        while len(drafted) < num_steps and run.stop_reason(ahead) is None:
            (step,) = await generate_steps(draft, [step_prompt(draft_opening, base, d)], rules,
                                           run.step_token_cap(ahead), logprobs=logprobs)
            drafted.append(step)
            base = [*base, written_step(len(base), "draft", step)]
            ahead = base[len(run.steps):]
            if step.ends:
                break
        return drafted

    next_round: asyncio.Task | None = None  # the draft's steps past the round being verified
    try:
        draft_opening, target_opening = opening_prompt(draft, question), opening_prompt(target, question)
        judge_opening = opening_messages(question)
        while (stop := run.stop_reason()) is None:
            if next_round is None and run.decide() is StepMode.TARGET:  # goodput: drafting does not pay now
                (step,) = await generate_steps(target, [step_prompt(target_opening, run.steps, d)], rules,
                                               run.step_token_cap())
                run.add(written_step(len(run.steps), "target", step, backoff=True), step.ends)
                continue
            drafted = await (next_round or draft_ahead(list(run.steps), control.gamma))
            next_round = None
            if not drafted:  # drafting stopped where the trace stops (a timeout in between)
                continue
            as_drafted = [*run.steps] + [written_step(len(run.steps) + i, "draft", s) for i, s in enumerate(drafted)]
            # The draft goes on from the last drafted step while the target verifies.
            next_round = None if drafted[-1].ends else asyncio.create_task(draft_ahead(as_drafted, control.gamma))
            positions = range(len(run.steps), len(as_drafted))
            prompts = [step_prompt(target_opening, as_drafted[:p], d) for p in positions]
            caps = [run.step_token_cap(as_drafted[len(run.steps):p]) for p in positions]
            # The target writes its own step at every position (what an equivalence judge
            # compares with, and the replacement at a rejection); a token-level verifier
            # reads the target's logprobs of the drafted tokens instead.
            own = None if logprobs is not None else await generate_steps(target, prompts, rules, caps)
            t1 = time.perf_counter()
            verdicts = await run.judge(judge, [
                drafted_candidate(question, as_drafted[:p], step, opening=judge_opening, prefix=prompt,
                                  target_step=own[j].text if own else None)
                for j, (p, step, prompt) in enumerate(zip(positions, drafted, prompts))])
            judge_seconds = (time.perf_counter() - t1) / len(drafted)
            # Acceptance rule: keep drafted steps while the judge accepts them; at the
            # first rejection the target's step for that position replaces the draft's
            # (written after a token-level cut's kept prefix, or its own from the
            # equivalence round) and everything drafted after it is dropped.
            num_accepted = 0
            for j, (step, verdict) in enumerate(zip(drafted, verdicts)):
                if run.stop_reason() is not None:
                    break
                judged = judged_fields(step, verdict, judge_seconds)
                if verdict.accept:
                    run.add(written_step(len(run.steps), "draft", step,
                                         num_verify_tokens=own[j].num_tokens if own else 0, **judged), step.ends)
                    num_accepted += 1
                    continue
                mine = own[j] if own else await rewrite_step(target, prompts[j], verdict, rules, caps[j])
                run.add(written_step(len(run.steps), "target", mine, **judged), mine.ends)
                break
            control.observe_round(num_accepted, min(num_accepted + 1, len(drafted)))
            if num_accepted < len(drafted) and next_round is not None:
                next_round.cancel()
                next_round = None
        if stop == "thinking":
            stop = await run.write_answer("target", target_opening)
    except EngineError as e:
        raise ReasoningError(f"lookahead: {e}", run.finish("error", error=str(e))) from e
    finally:
        if next_round is not None and not next_round.done():
            next_round.cancel()
            await asyncio.gather(next_round, return_exceptions=True)  # cancelled work: nothing to keep
    return run.finish(stop)
