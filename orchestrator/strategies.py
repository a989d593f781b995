"""Strategies by name, and what each one needs.

================ ====================================================== ===== =======
name             who writes a step                                      draft judge
================ ====================================================== ===== =======
target-only      the target, always                                     -     -
draft-only       the draft, always                                      yes   -
specreason       the draft; the target rewrites steps its judge rejects yes   likelihood
                 (from a token-level cut: partial acceptance)
lookahead        the draft, γ ahead; the target checks them in a batch  yes   cascade
spec-thinking    the draft; the target after a reflection cue           yes   -
arbitrage        the draft; the target where a router routes the step   yes   (router)
arbitrage-oracle both, every step; the judge keeps the better one       yes   score
tree             beam search: the draft proposes k steps per branch,    yes   likelihood
                 the judge rates all in one batch, the best b go on
                 (a branch with none passing: the target repairs it)
tree-target      the same search with the target proposing (baseline)   -     likelihood
best-of-n        n drafted solutions, verified step by step, a vote     yes   likelihood
best-of-n-target n solutions the target samples, the same vote          -     likelihood
================ ====================================================== ===== =======

Each strategy module declares its options (a :class:`StrategyOptions` model: one
default and constraint per field) and its step policy; :func:`orchestrator.driver.drive`
runs the policy inside the shell every strategy shares (budgets, stop reasons,
``</think>``, engine errors, the trace's stats).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from common.registry import Entry, Registry
from engine.speculation import TokenMethod
from orchestrator.arbitrage import ArbitrageOptions, arbitrage, arbitrage_oracle
from orchestrator.baseline import NoOptions, draft_only, target_only
from orchestrator.best_of_n import BestOfNOptions, BestOfNTargetOptions, best_of_n, best_of_n_target
from orchestrator.driver import StrategyError, StrategyOptions
from orchestrator.lookahead import LookaheadOptions, lookahead
from orchestrator.spec_thinking import SpecThinkingOptions, spec_thinking
from orchestrator.specreason import SpecReasonOptions, specreason
from orchestrator.trace import Trace
from orchestrator.tree import TreeOptions, TreeTargetOptions, tree, tree_target

__all__ = ["STRATEGIES", "Strategy", "StrategyError", "check_options", "get_strategy"]


@dataclass(frozen=True)
class Strategy(Entry):
    """A registered strategy: its policy (``run``), its own options (``options_model``: names,
    defaults, constraints) and what it needs of the models."""

    # run(question, *, target, draft, judge, router, governor, rules, budget, on_step, **options) -> Trace
    run: Callable[..., Awaitable[Trace]]
    needs_draft: bool
    default_judge: str | None  # None: the strategy takes no judge
    # Whether the target model writes or judges anything (draft-only: no, so no target engine starts).
    needs_target: bool = True
    # Whether the judge sees the target's own step (equivalence judges need it).
    judge_sees_target_step: bool = False
    needs_router: bool = False  # decisions come from a router (routers/), not a judge
    # Judge requests from all of a reasoner's problems go through one batching queue.
    queued_judge: bool = False
    # The token-level speculation inside the target that makes this strategy fastest (what the
    # engine pair's target_spec "auto" means for it). Where the target writes most of the trace,
    # the 0.5B drafting its tokens (engines_cpu); where it mostly verifies drafted steps and
    # writes a token at a cut, suffix decoding, whose verifications and one-token writes cost
    # less than with the draft model inside the target (speed_choice_gsm8k100-129_cpu,
    # target_spec_gsm8k100-108_cpu).
    target_spec: TokenMethod = TokenMethod.DRAFT

    @property
    def options(self) -> tuple[str, ...]:
        """Names of the strategy's own options (not the shared question/engines/rules/budget)."""
        return tuple(self.options_model.model_fields)

    @property
    def backs_off(self) -> bool:
        """Whether it takes the goodput governor (option ``backoff``): one shared by a reasoner's problems."""
        return "backoff" in self.options_model.model_fields


STRATEGIES: Registry[Strategy] = Registry("strategy", StrategyError, plural="Strategies", entries=(
    Strategy("target-only", NoOptions, target_only, needs_draft=False, default_judge=None),
    Strategy("draft-only", NoOptions, draft_only, needs_draft=True, default_judge=None, needs_target=False),
    Strategy("specreason", SpecReasonOptions, specreason, needs_draft=True, default_judge="likelihood",
             target_spec=TokenMethod.SUFFIX),
    Strategy("lookahead", LookaheadOptions, lookahead, needs_draft=True, default_judge="cascade",
             judge_sees_target_step=True),
    Strategy("spec-thinking", SpecThinkingOptions, spec_thinking, needs_draft=True, default_judge=None),
    Strategy("arbitrage", ArbitrageOptions, arbitrage, needs_draft=True, default_judge=None, needs_router=True),
    Strategy("arbitrage-oracle", NoOptions, arbitrage_oracle, needs_draft=True, default_judge="score"),
    Strategy("tree", TreeOptions, tree, needs_draft=True, default_judge="likelihood", queued_judge=True),
    Strategy("tree-target", TreeTargetOptions, tree_target, needs_draft=False, default_judge="likelihood",
             queued_judge=True),
    Strategy("best-of-n", BestOfNOptions, best_of_n, needs_draft=True, default_judge="likelihood",
             queued_judge=True),
    Strategy("best-of-n-target", BestOfNTargetOptions, best_of_n_target, needs_draft=False,
             default_judge="likelihood", queued_judge=True),
))


def get_strategy(name: str) -> Strategy:
    return STRATEGIES.find(name)


def check_options(strategy: Strategy, options: Mapping[str, Any]) -> StrategyOptions:
    """``options`` validated by the strategy's model: an unknown name (with the closest one)
    or a bad value (naming the option) is a :class:`StrategyError`."""
    return strategy.options_model.of(strategy.name, options)
