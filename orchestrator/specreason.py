"""``specreason``: the draft writes each step, a judge keeps it or the target rewrites it.

SpecReason (Pan et al., 2025): the small model drafts a reasoning step; the
large model scores it 0-9 in one token (the ``score`` judge, prefix-cached);
a step scored at or above the threshold stays, otherwise the large model
writes that step itself from the same prefix. The first ``first_target_steps``
steps are written by the target outright (default 2: the opening and the plan; why:
:class:`orchestrator.driver.TargetOpening`). Chosen on GSM8K test problems 100-129 (not
the bench's), all at once, likelihood judge at its defaults: target-only 19/30; drafting
from the first step 17/30 (4 lost, 2 gained), the target writing 31% of the tokens; the
target writing the first two steps 19/30 (3 lost, 3 gained), the target writing 47%.

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
from typing import Any

from engine.protocol import Engine
from judges.base import Judge, JudgeError
from orchestrator.driver import Backoff, Policy, TargetOpening, backoff_governor, drive, split_shared
from orchestrator.goodput import GoodputGovernor, StepMode
from orchestrator.run import TraceRun, draft_logprobs, judged_fields
from orchestrator.trace import Author, Trace


class SpecReasonOptions(Backoff, TargetOpening):
    """The target's opening steps, and backing off under load."""


class SpecReason(Policy):
    name = "specreason"

    def __init__(self, judge: Judge, options: SpecReasonOptions) -> None:
        if judge.needs_target_step:
            raise JudgeError(
                f"specreason cannot use judge '{judge.name}': it compares with the target's step, and "
                "specreason asks the target only after a rejection; use 'score' or 'likelihood' (or the "
                "'lookahead' strategy)")
        self.judge, self.options = judge, options

    async def step(self, run: TraceRun) -> None:
        mode = run.decide()  # goodput: at this load, does drafting pay?
        if len(run.steps) < self.options.first_target_steps or mode is StepMode.TARGET:
            run.keep(Author.TARGET, await run.write("target"), backoff=mode is StepMode.TARGET)
            return
        drafted = await run.write("draft", logprobs=draft_logprobs(self.judge))
        t0 = time.perf_counter()
        (verdict,) = await run.judge(self.judge, [run.candidate(drafted)])
        judged = judged_fields(drafted, verdict, time.perf_counter() - t0)
        # Acceptance rule: a drafted step the judge accepts joins the trace as written;
        # a rejected one is rewritten by the target from the same prefix, after the
        # drafted tokens a token-level verifier kept before its cut (if it cut one).
        if verdict.accept:
            run.keep(Author.DRAFT, drafted, **judged)
        else:
            run.keep(Author.TARGET, await run.rewrite(verdict), **judged)


async def specreason(question: str, *, draft: Engine, target: Engine, judge: Judge,
                     governor: GoodputGovernor | None = None, **options: Any) -> Trace:
    """``options``: :class:`SpecReasonOptions`, and the driver's ``rules``, ``budget``, ``on_step``."""
    shared, options = split_shared(options)
    o = SpecReasonOptions.parse("specreason", options)
    return await drive(SpecReason(judge, o), question, {"draft": draft, "target": target},
                       governor=backoff_governor(o.backoff, governor), **shared)
