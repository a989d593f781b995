"""The driver: the shell every strategy shares, around the one thing each does its own way.

A strategy is a *policy*: given the trace so far, write the next step(s). The
driver owns everything else, the same way for every strategy:

1. start: the :class:`TraceRun` (engines counted per trace, the governor entered);
2. the loop on the stop reason: while :meth:`TraceRun.stop_reason` is None (no step
   ended the trace, no budget is spent), ``await policy.step(run)``; where the strategy
   backs off under load, the goodput governor is asked first (:class:`Turn`), and when
   drafting does not pay at the load the target writes the step instead;
3. thinking: a step that closed ``</think>`` stops the loop; the policy's
   ``answerer`` writes the answer after it (:meth:`TraceRun.write_answer`);
4. errors: an :class:`EngineError` becomes a :class:`ReasoningError` holding the
   trace so far (stop reason ``error``); ``policy.close()`` runs however it ends;
5. finish: the :class:`Trace` and its stats, with ``policy.search()`` (what a search
   explored beside the chosen steps).

A step policy calls ``run.write`` (a model writes a step), ``run.judge``, and
``run.keep`` (the step joins the trace). A search policy (tree, best-of-n) is the
same shape: its one ``step`` searches, and ``run.adopt``-s the chosen steps, ending the
trace with the search's stop reason.

Strategies register themselves (:mod:`stepspec.orchestrator.registry`). Options: each strategy
declares its own as a :class:`StrategyOptions` model (frozen, unknown names refused), one
default and constraint per field; :meth:`StrategyOptions.parse` turns a bad name or value
into a :class:`StrategyError` naming it.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Any, Callable, ClassVar, Mapping, Self

from pydantic import Field

from stepspec.common.options import Options
from stepspec.engine.protocol import Engine, EngineError
from stepspec.engine.session import TRACE_SESSION, new_session
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.goodput import GoodputGovernor
from stepspec.orchestrator.run import ReasoningError, TraceRun
from stepspec.orchestrator.steps import StepRules
from stepspec.orchestrator.trace import Author, StepRecord, StopReason, Trace


class StrategyError(ValueError):
    """An unknown strategy, or options it does not take."""


class StrategyOptions(Options):
    """A strategy's own options (none here: subclasses declare theirs); a mistake is a
    :class:`StrategyError` in :func:`stepspec.common.options.explain`'s words ("strategy 'lookahead':
    gamma must be an integer >= 1, got 0")."""

    error: ClassVar[type[Exception]] = StrategyError

    @classmethod
    def of(cls, strategy: str, options: Mapping[str, Any]) -> Self:
        """The options of ``strategy``, validated."""
        return cls.parse(options, owner=f"strategy '{strategy}'")


class TargetOpening(StrategyOptions):
    """The option of the strategies that draft: the target writes the first steps itself.

    A drafted plan whose every token the target finds plausible can still be the wrong
    plan, and the target then follows it (GSM8K #0: "1. Calculate the number of eggs Janet
    eats" leads the 1.5B itself to 16 - 3 = 13). Letting the target write the opening and
    the plan (2 steps) closes that gap. The searches use it per branch:
    in ``tree`` the target proposes the candidates of the first depths, in ``best-of-n`` it
    samples the first steps of every solution.
    """

    first_target_steps: int = Field(2, ge=0, description="steps the target writes before the draft starts "
                                                         "(the opening and the plan)")


class Backoff(StrategyOptions):
    """The option of the strategies that back off under load (goodput, :mod:`stepspec.orchestrator.goodput`).

    A governor shared by a reasoner's problems in flight measures, per load, what a
    drafted step and a target-written one cost per token, and has the target write when
    drafting does not pay: with many problems in flight the target decodes them in one
    batch, and the draft-verify-repair round loses. Alone (one problem) the draft drafts.
    """

    backoff: bool = Field(True, description="the target writes when, at the measured load, drafting does not "
                                            "pay (goodput)")


class StepBackoff(Backoff):
    """Backing off step by step (the driver asks the governor before each step), and how much
    the target writes in one call when it does. Example, the default 640 with a 640-token
    budget under load: the governor's first answer for a trace is the target, which writes the
    whole trace in one generation, as target-only writes alone (no call per step, no sample
    for the governor: that step carries the question's prefill); one problem alone drafts."""

    backoff_tokens: int = Field(640, ge=0, description="backing off, the target writes up to this many tokens in "
                                "one generation (kept as the steps it holds) before the governor is asked again, "
                                "as it writes alone; 0: one step per call")


class Turn(StrEnum):
    """What the next step is to the goodput governor, which the driver asks before each step
    (:meth:`Policy.turn`). Example: ``specreason``'s first two steps are its OPENING (the
    target's, by the policy), its third step GOVERNED: at a load where drafted steps cost more
    per token than the target's, the driver has the target write it (``backoff=True``)."""

    GOVERNED = "governed"  # the governor picks who writes it, and times it as its mode's sample
    UNTIMED = "untimed"  # the governor picks, and does not time it (it carries the question's prefill)
    OPENING = "opening"  # the policy's own target step: counted as running, neither picked nor timed
    UNGOVERNED = "ungoverned"  # no pick now: drafted work in flight, or a search that picks per round


class Policy:
    """What one strategy does: write the next step(s) of a trace. Registered by
    :func:`stepspec.orchestrator.registry.strategy` (which sets ``name``, the trace's strategy);
    subclasses define :meth:`step`, and :meth:`turn` where it is not GOVERNED."""

    name: str
    answerer: Author = Author.TARGET  # who writes the answer after </think>

    def __init__(self, options: StrategyOptions) -> None:
        self.options = options

    def turn(self, run: TraceRun) -> Turn:
        """What the next step is to the governor (it is asked only where the strategy backs off)."""
        return Turn.GOVERNED

    async def step(self, run: TraceRun) -> None:
        """Write the next step(s): ``run.keep`` them (a search: ``run.adopt`` its chosen steps)."""
        raise NotImplementedError

    async def close(self) -> None:
        """The trace stopped (however): drop work still in flight."""

    def search(self) -> dict[str, Any] | None:
        """What a search explored beside the chosen steps (``Trace.search``)."""
        return None


async def drive(policy: Policy, question: str, engines: Mapping[str, Engine | None], *,
                rules: StepRules = StepRules(), budget: Budget = Budget(),
                on_step: Callable[[StepRecord], None] | None = None,
                governor: GoodputGovernor | None = None, backoff_tokens: int = 0) -> Trace:
    """One trace of ``question`` written by ``policy`` over ``engines`` (by role; None: absent);
    ``governor``: where the strategy backs off, and ``backoff_tokens`` (:class:`Backoff`).
    Its model calls carry a session id (:mod:`stepspec.engine.session`): the caller's, or its own."""
    session = None if TRACE_SESSION.get() else TRACE_SESSION.set(new_session())
    try:
        return await _drive(policy, question, engines, rules, budget, on_step, governor, backoff_tokens)
    finally:
        if session is not None:
            TRACE_SESSION.reset(session)


async def _drive(policy: Policy, question: str, engines: Mapping[str, Engine | None], rules: StepRules,
                 budget: Budget, on_step: Callable[[StepRecord], None] | None,
                 governor: GoodputGovernor | None, backoff_tokens: int) -> Trace:
    run = TraceRun(question, policy.name, rules, budget, {r: e for r, e in engines.items() if e is not None},
                   on_step, governor)
    try:
        await run.open()
        # Problems given together (solve_many, a wave) have each entered the governor before
        # any decides: the first one's first step is decided at their load, not alone.
        await asyncio.sleep(0)
        while (stop := run.stop_reason()) is None:
            turn = policy.turn(run)
            # goodput: where drafting does not pay at this load, the target writes the step
            if turn is not Turn.UNGOVERNED and turn is not Turn.OPENING and run.decide(
                    sample=turn is Turn.GOVERNED) is Author.TARGET:
                await run.write_on(Author.TARGET, backoff_tokens, backoff=True)
                continue
            if turn is Turn.OPENING:
                run.decide(forced=Author.TARGET)  # counted as running, neither picked nor timed
            await policy.step(run)
        if stop is StopReason.THINKING:
            stop = await run.write_answer(policy.answerer)
    except EngineError as e:
        raise ReasoningError(f"{policy.name}: {e}", run.finish(StopReason.ERROR, error=str(e))) from e
    finally:
        await policy.close()
        run.leave()  # any other failure too: the governor's count of traces in flight stays right
    return run.finish(stop, search=policy.search())
