"""Strategies by name: each registers itself beside its policy.

A strategy is a :class:`~stepspec.orchestrator.driver.Policy` class, its options model and what it
needs of the models. The :func:`strategy` decorator puts it in :data:`STRATEGIES` (as
lm-evaluation-harness registers its models); :meth:`Strategy.run` validates the options,
builds the policy and runs it in :func:`~stepspec.orchestrator.driver.drive`, the same way for
every strategy. :mod:`stepspec.orchestrator.strategies` imports every strategy module, so the
registry is full once it is imported.

Worked example::

    @strategy("spec-thinking", SpecThinkingOptions, needs_draft=True)
    class SpecThinking(Policy):
        def __init__(self, options: SpecThinkingOptions) -> None: ...

    await STRATEGIES["spec-thinking"].run(question, target=t, draft=d, takeover_tokens=50)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from stepspec.common.registry import Entry, Registry
from stepspec.engine.protocol import Engine
from stepspec.engine.speculation import TokenMethod
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.driver import Backoff, Policy, StepBackoff, StrategyError, StrategyOptions, drive
from stepspec.orchestrator.goodput import GoodputGovernor
from stepspec.orchestrator.steps import StepRules
from stepspec.orchestrator.trace import Author, StepRecord, Trace

P = TypeVar("P", bound=type[Policy])


@dataclass(frozen=True)
class Strategy(Entry):
    """A registered strategy: its policy class (built as ``policy(options)``, with ``judge=``
    where it takes a judge and ``router=`` where it takes a router), its own options
    (``options_model``: names, defaults, constraints) and what it needs of the models."""

    policy: type[Policy] = field(default=Policy, repr=False)
    writes: str = ""  # who writes a step, in a few words (the README's and the CLI's strategy table)
    needs_draft: bool = True
    default_judge: str | None = None  # None: the strategy takes no judge
    # Whether the target model writes or judges anything (draft-only: no, so no target engine starts).
    needs_target: bool = True
    # Whether the judge sees the target's own step (equivalence judges need it).
    judge_sees_target_step: bool = False
    needs_router: bool = False  # decisions come from a router (stepspec/routers/), not a judge
    # Judge requests from all of a reasoner's problems go through one batching queue.
    queued_judge: bool = False
    # The token-level speculation inside the target that makes this strategy fastest (what the
    # engine pair's target_spec "auto" means for it): the draft model inside the target where
    # the target writes most of the trace; suffix decoding where it mostly verifies drafted
    # steps and writes a token at a cut.
    target_spec: TokenMethod = TokenMethod.DRAFT

    @property
    def options(self) -> tuple[str, ...]:
        """Names of the strategy's own options (not the shared question/engines/rules/budget)."""
        return tuple(self.options_model.model_fields)

    @property
    def backs_off(self) -> bool:
        """Whether it takes the goodput governor (option ``backoff``): one shared by a reasoner's problems."""
        return issubclass(self.options_model, Backoff)

    async def run(self, question: str, *, target: Engine | None = None, draft: Engine | None = None,
                  judge: Any = None, router: Any = None, governor: GoodputGovernor | None = None,
                  rules: StepRules = StepRules(), budget: Budget = Budget(),
                  on_step: Callable[[StepRecord], None] | None = None, **options: Any) -> Trace:
        """One trace of ``question``. ``options``: the strategy's own (an unknown name or a bad
        value is a :class:`StrategyError` before any engine call); ``governor``: the one shared
        by a reasoner's problems, for a strategy that backs off (else it gets its own)."""
        o = self.options_model.of(self.name, options)
        engines = {Author.TARGET: target if self.needs_target else None,
                   Author.DRAFT: draft if self.needs_draft else None}
        for role, needed in ((Author.TARGET, self.needs_target), (Author.DRAFT, self.needs_draft)):
            if needed and engines[role] is None:
                raise StrategyError(f"strategy '{self.name}' needs a {role} engine")
        deciders = {"judge": judge} if self.default_judge is not None else {}
        if self.needs_router:
            deciders["router"] = router
        policy = self.policy(o, **deciders)
        backoff = self.backs_off and o.backoff
        return await drive(policy, question, engines, rules=rules, budget=budget, on_step=on_step,
                           governor=(governor or GoodputGovernor()) if backoff else None,
                           backoff_tokens=o.backoff_tokens if backoff and isinstance(o, StepBackoff) else 0)


STRATEGIES: Registry[Strategy] = Registry("strategy", StrategyError, plural="Strategies")


def strategy(name: str, options: type[StrategyOptions] = StrategyOptions, **needs: Any) -> Callable[[P], P]:
    """Register the decorated policy class as strategy ``name``, with its options model and
    ``needs`` (the :class:`Strategy` fields: ``needs_draft``, ``default_judge``, ...)."""

    def register(policy: P) -> P:
        policy.name = name
        STRATEGIES.add(Strategy(name, options, policy, **needs))
        return policy

    return register
