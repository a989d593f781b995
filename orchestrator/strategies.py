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
default and constraint per field) and its step policy, registered by
:func:`orchestrator.registry.strategy`; :func:`orchestrator.driver.drive` runs the policy
inside the shell every strategy shares (budgets, stop reasons, ``</think>``, the goodput
governor, engine errors, the trace's stats). Importing this module registers them all.
"""

from __future__ import annotations

from typing import Any, Mapping

# Each strategy module registers its strategies when imported, in the order of the table above.
from orchestrator import baseline, specreason, lookahead, spec_thinking, arbitrage, tree, best_of_n  # noqa: F401
from orchestrator.driver import StrategyError, StrategyOptions
from orchestrator.registry import STRATEGIES, Strategy

__all__ = ["STRATEGIES", "Strategy", "StrategyError", "check_options", "get_strategy"]


def get_strategy(name: str) -> Strategy:
    return STRATEGIES.find(name)


def check_options(strategy: Strategy, options: Mapping[str, Any]) -> StrategyOptions:
    """``options`` validated by the strategy's model: an unknown name (with the closest one)
    or a bad value (naming the option) is a :class:`StrategyError`."""
    return strategy.options_model.of(strategy.name, options)
