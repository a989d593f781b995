"""Strategies by name, and what each one needs.

Who writes a step in each, and its default judge:
:func:`stepspec.orchestrator.config.strategy_table` (the README's table is that table). Each strategy module declares its options (a :class:`StrategyOptions` model: one
default and constraint per field) and its step policy, registered by
:func:`stepspec.orchestrator.registry.strategy`; :func:`stepspec.orchestrator.driver.drive` runs the policy
inside the shell every strategy shares (budgets, stop reasons, ``</think>``, the goodput
governor, engine errors, the trace's stats). Importing this module registers them all.
"""

from __future__ import annotations

from typing import Any, Mapping

# Each strategy module registers its strategies when imported; listed in the order below.
from stepspec.orchestrator import baseline, specreason, lookahead, spec_thinking, arbitrage, tree, best_of_n  # noqa: F401
from stepspec.orchestrator.driver import StrategyError, StrategyOptions
from stepspec.orchestrator.registry import STRATEGIES, Strategy

STRATEGIES.order(["target-only", "draft-only", "specreason", "lookahead", "spec-thinking", "arbitrage",
                  "arbitrage-oracle", "tree", "tree-target", "best-of-n", "best-of-n-target"])

__all__ = ["STRATEGIES", "Strategy", "StrategyError", "check_options", "get_strategy"]


def get_strategy(name: str) -> Strategy:
    return STRATEGIES.find(name)


def check_options(strategy: Strategy, options: Mapping[str, Any]) -> StrategyOptions:
    """``options`` validated by the strategy's model: an unknown name (with the closest one)
    or a bad value (naming the option) is a :class:`StrategyError`."""
    return strategy.options_model.of(strategy.name, options)

