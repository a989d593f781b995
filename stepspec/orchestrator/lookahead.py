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
the measured load says drafting does not pay (:mod:`stepspec.orchestrator.goodput`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from pydantic import Field, model_validator

from stepspec.judges.base import Judge
from stepspec.orchestrator.driver import Policy, StepBackoff, Turn
from stepspec.orchestrator.registry import strategy
from stepspec.orchestrator.run import TraceRun, draft_logprobs, judged_fields, written_step
from stepspec.orchestrator.stepgen import GeneratedStep
from stepspec.orchestrator.trace import Author, StepRecord


class LookaheadOptions(StepBackoff):
    gamma: int = Field(4, ge=1, description="steps drafted ahead in the first round")
    min_gamma: int = Field(1, ge=1)
    max_gamma: int = Field(8, ge=1)
    adaptive: bool = Field(True, description="γ follows the running step acceptance rate")

    @model_validator(mode="after")
    def _ordered(self) -> "LookaheadOptions":
        GammaController(self.gamma, self.min_gamma, self.max_gamma)  # 1 <= min_gamma <= gamma <= max_gamma
        return self


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


@strategy("lookahead", LookaheadOptions, default_judge="cascade", judge_sees_target_step=True,
          writes="the draft, γ steps ahead; the target checks them in a batch")
class Lookahead(Policy):
    def __init__(self, options: LookaheadOptions, judge: Judge) -> None:
        self.judge, self.logprobs = judge, draft_logprobs(judge)
        self.control = GammaController(options.gamma, options.min_gamma, options.max_gamma, options.adaptive)
        self.next_round: asyncio.Task | None = None  # the draft's steps past the round being verified

    async def draft_ahead(self, run: TraceRun, base: list[StepRecord], num_steps: int) -> list[GeneratedStep]:
        """Up to ``num_steps`` drafted steps after ``base``, stopping where the trace would."""
        drafted: list[GeneratedStep] = []
        while len(drafted) < num_steps and not (drafted and drafted[-1].ends) and run.stop_reason(
                base[len(run.steps):]) is None:
            drafted.append(await run.write(Author.DRAFT, base, logprobs=self.logprobs))
            base = [*base, written_step(len(base), Author.DRAFT, drafted[-1])]
        return drafted

    def turn(self, run: TraceRun) -> Turn:
        return Turn.GOVERNED if self.next_round is None else Turn.UNGOVERNED  # a round drafted ahead: go on

    async def step(self, run: TraceRun) -> None:
        drafted = await (self.next_round or self.draft_ahead(run, list(run.steps), self.control.gamma))
        self.next_round = None
        if not drafted:  # drafting stopped where the trace stops (a timeout in between)
            return
        n = len(run.steps)
        as_drafted = [*run.steps] + [written_step(n + i, Author.DRAFT, s) for i, s in enumerate(drafted)]
        if not drafted[-1].ends:  # the draft goes on from the last drafted step while the target verifies
            self.next_round = asyncio.create_task(self.draft_ahead(run, as_drafted, self.control.gamma))
        bases = [as_drafted[:n + j] for j in range(len(drafted))]  # where each drafted step was written
        # The target writes its own step at every position (what an equivalence judge compares
        # with, and the replacement at a rejection); a token-level verifier reads the target's
        # logprobs of the drafted tokens instead.
        own = None if self.logprobs is not None else await run.write_many(Author.TARGET, bases)
        t1 = time.perf_counter()
        verdicts = await run.judge(self.judge, [run.candidate(step, base, own[j].text if own else None)
                                                for j, (step, base) in enumerate(zip(drafted, bases))])
        judge_seconds = (time.perf_counter() - t1) / len(drafted)
        # Acceptance rule: keep drafted steps while the judge accepts them; at the first
        # rejection the target's step for that position replaces the draft's (after a
        # token-level cut's kept prefix) and everything drafted after it is dropped.
        num_accepted = 0
        for j, (step, verdict) in enumerate(zip(drafted, verdicts)):
            if run.stop_reason() is not None:
                break
            judged = judged_fields(step, verdict, judge_seconds)
            if not verdict.accept:
                run.keep(Author.TARGET, own[j] if own else await run.rewrite(verdict, bases[j]), **judged)
                break
            run.keep(Author.DRAFT, step, num_verify_tokens=own[j].num_tokens if own else 0, **judged)
            num_accepted += 1
        self.control.observe_round(num_accepted, min(num_accepted + 1, len(drafted)))
        if num_accepted < len(drafted):  # the next round bet on every drafted step: dropped
            await self.close()

    async def close(self) -> None:
        if self.next_round is not None and not self.next_round.done():
            self.next_round.cancel()
            await asyncio.gather(self.next_round, return_exceptions=True)  # cancelled work: nothing to keep
        self.next_round = None
