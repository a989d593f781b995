"""``specreason``: the draft writes each step, a judge keeps it or the target rewrites it.

SpecReason (Pan et al., 2025): the small model drafts a reasoning step, the large
model judges it, and a step it rejects the large model writes itself. The judge by
default is ``likelihood``, a token-level verifier: one prefill of the drafted step
under the target gives each drafted token's rank and logprob, and the first token the
target finds implausible is the *cut* (a rejection is partial: the drafted tokens before
the cut stay). With the paper's ``score`` judge (the target scores the step 0-9 in one
token) a step scored at or above the threshold stays and the target rewrites the rest
whole. The first ``first_target_steps`` steps are written by the target outright
(default 2: the opening and the plan; why: :class:`stepspec.orchestrator.driver.TargetOpening`);
with ``draft_opening`` the draft writes the first (the opening sentence, judged as any
drafted step) and the target the plan. In a turn that may call a tool (tools declared, or an
agent's turn after a tool's result) the target writes the opening too: that step decides
between a call and text, and a drafted one the target finds plausible leads the turn astray
("To generate the response for the given function call, ..." calls the same tool again
instead of answering; "I'm sorry, but I can't assist with that." answers where a call was due).

Worked example, the default judge: the draft writes "16 - 3 = 13 eggs."; every token is
among the target's likeliest: kept, author "draft". At a cut the target's own token goes
in (``num_kept_tokens`` and ``cut`` in the step's record); the verification computed that
token, so it goes in without a call (a call writes it where it would end the generation:
the end of the turn, a stop string). Then the draft drafts on from there (the record is an
open piece of the step, ``complete=False``; what the draft writes next is judged again),
for the first ``draft_after_cut`` cuts of a step; after that, the target writes the rest
of the step. With ``draft_after_cut=2``: the draft writes "She sells 16 - 3 - 4 = 8 eggs
for $2 each." and the verifier cuts at "8" (the target's token is "9"): "She sells 16 - 3 -
4 = 9" joins the trace as an open piece; the draft writes on " eggs for $2 each, so she
makes 9 * 2 = $18." and the verifier accepts it: the step is complete, the target wrote
one token of it. With ``judge="score"``, threshold 7: "13 - 4 = 8 eggs." scored 2.1 is
rejected whole; the target writes "13 - 4 = 9 eggs." from the same prefix (author
"target", draft_text keeps the rejected step).

``confident_logprob`` (confidence-gated verification, after ConfSpec): a drafted step
each of whose tokens the draft wrote with at least that logprob joins the trace without
the target's check (judge "confident"); the draft's own certainty stands in for a
verification. Worked example, -0.5: "13 - 4 = 9 eggs." drafted with its least sure token
at -0.2 is kept unchecked; "She sells 9 eggs for $2 each." with " $" at -1.3 is verified.

``backoff`` (goodput-aware speculation, :mod:`stepspec.orchestrator.goodput`): before each
step the driver asks a governor shared by all problems in flight, which compares the
measured seconds per token of drafted and target-written steps at the current load,
and has the target write the step when drafting does not pay (``backoff=True`` in its record).
"""

from __future__ import annotations

import time
from typing import Sequence

from pydantic import Field

from stepspec.engine.speculation import TokenMethod
from stepspec.judges.base import Judge, JudgeError
from stepspec.orchestrator.driver import Policy, StepBackoff, TargetOpening, Turn
from stepspec.orchestrator.prompts import answers_tool_result
from stepspec.orchestrator.registry import strategy
from stepspec.orchestrator.run import TraceRun, draft_logprobs, judged_fields
from stepspec.orchestrator.trace import Author, StepRecord


class SpecReasonOptions(StepBackoff, TargetOpening):
    """The target's opening steps, backing off under load, and how a cut step is repaired."""

    draft_opening: bool = Field(True, description="the draft writes the first step (the opening sentence), "
                                "judged as any drafted step; the target writes the rest of its first_target_steps "
                                "(the plan); not in a turn that may call a tool (tools declared, or after a tool's "
                                "result), which the target opens")

    draft_after_cut: int = Field(2, ge=0, description="after a token-level cut, the target's own token at the cut "
                                 "goes in (read from the verification, no call, where the engine can tell it) and "
                                 "the draft drafts on from there (judged again), up to this many times in a step; "
                                 "past that (and with 0) the target writes the rest of the step")

    confident_logprob: float | None = Field(None, lt=0, description="a drafted step each of whose tokens the draft "
                                            "wrote with at least this logprob is kept without the target's check "
                                            "(confidence-gated verification; a tool call's step is always checked); "
                                            "None: every drafted step is checked")


@strategy("specreason", SpecReasonOptions, default_judge="likelihood", target_spec=TokenMethod.SUFFIX,
          writes="the draft; the target rewrites steps its judge rejects, from a token-level cut (partial acceptance)")
class SpecReason(Policy):
    def __init__(self, options: SpecReasonOptions, judge: Judge) -> None:
        if judge.needs_target_step:
            raise JudgeError(
                f"specreason cannot use judge '{judge.name}': it compares with the target's step, and "
                "specreason asks the target only after a rejection; use 'score' or 'likelihood' (or the "
                "'lookahead' strategy)")
        self.judge, self.options = judge, options

    def turn(self, run: TraceRun) -> Turn:
        done = sum(s.complete for s in run.steps)  # complete steps (a cut step is written in pieces)
        drafts_opening = self.options.draft_opening and not may_call(run)
        if done < self.options.first_target_steps and not (drafts_opening and done == 0):
            return Turn.OPENING
        return Turn.GOVERNED if done else Turn.UNTIMED  # the first step carries the question's prefill

    async def step(self, run: TraceRun) -> None:
        if self.turn(run) is Turn.OPENING:
            run.keep(Author.TARGET, await run.write(Author.TARGET))
            return
        gate = self.options.confident_logprob
        logprobs = draft_logprobs(self.judge)
        drafted = await run.write(Author.DRAFT, logprobs=0 if gate is not None and logprobs is None else logprobs)
        candidate = run.candidate(drafted)
        if gate is not None and not candidate.exact and confident(drafted.token_logprobs, gate):
            run.keep(Author.DRAFT, drafted, draft_text=drafted.text, accepted=True, judge=CONFIDENT)
            return
        t0 = time.perf_counter()
        (verdict,) = await run.judge(self.judge, [candidate])
        judged = judged_fields(drafted, verdict, time.perf_counter() - t0)
        # Acceptance rule: a drafted step the judge accepts joins the trace as written;
        # a rejected one is rewritten by the target from the same prefix, after the
        # drafted tokens a token-level verifier kept before its cut (if it cut one): only
        # the target's token at the cut (the step stays open, the draft drafts on) for the
        # first draft_after_cut cuts of a step, the rest of the step after that.
        if verdict.accept:
            run.keep(Author.DRAFT, drafted, **judged)
        elif verdict.cut is not None and cuts_in_open_step(run.steps) < self.options.draft_after_cut:
            piece = await run.rewrite(verdict, cap=1)  # the verification's token at the cut: no call
            run.keep(Author.TARGET, piece, **judged)
        else:
            run.keep(Author.TARGET, await run.rewrite(verdict), **judged)


# The judge name of a drafted step kept unchecked by the confidence gate.
CONFIDENT = "confident"


def confident(logprobs: Sequence[float], floor: float) -> bool:
    """Whether the draft wrote every token of a step with at least ``floor`` logprob."""
    return bool(logprobs) and min(logprobs) >= floor


def may_call(run: TraceRun) -> bool:
    """Whether the turn may call a tool: tools declared (``rules.calls``), or a turn after a tool's result."""
    return run.rules.calls is not None or answers_tool_result(run.question)


def cuts_in_open_step(steps: Sequence[StepRecord]) -> int:
    """How many cuts the step being written (the records since the last complete one) has had."""
    n = 0
    for step in reversed(steps):
        if step.complete:
            break
        n += step.cut is not None
    return n
