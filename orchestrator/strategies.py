"""Strategies by name, and what each one needs.

================ ====================================================== ===== =======
name             who writes a step                                      draft judge
================ ====================================================== ===== =======
target-only      the target, always                                     -     -
draft-only       the draft, always                                      yes   -
specreason       the draft; the target rewrites steps its judge rejects yes   score
lookahead        the draft, γ ahead; the target checks them in a batch  yes   cascade
spec-thinking    the draft; the target after a reflection cue           yes   -
arbitrage        the draft; the target where a router routes the step   yes   (router)
arbitrage-oracle both, every step; the judge keeps the better one       yes   score
================ ====================================================== ===== =======
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from orchestrator.arbitrage import arbitrage, arbitrage_oracle
from orchestrator.baseline import draft_only, target_only
from orchestrator.lookahead import lookahead
from orchestrator.spec_thinking import spec_thinking
from orchestrator.specreason import specreason
from orchestrator.trace import Trace


class StrategyError(ValueError):
    """An unknown strategy, or options it does not take."""


@dataclass(frozen=True)
class Strategy:
    name: str
    run: Callable[..., Awaitable[Trace]]
    needs_draft: bool
    default_judge: str | None  # None: the strategy takes no judge
    # Whether the judge sees the target's own step (equivalence judges need it).
    judge_sees_target_step: bool = False
    needs_router: bool = False  # decisions come from a router (routers/), not a judge

    @property
    def options(self) -> tuple[str, ...]:
        """Keyword options of the strategy itself (not the shared question/engines/rules/budget)."""
        shared = {"question", "draft", "target", "judge", "router", "rules", "budget", "on_step", "on_example",
                  "problem_id"}
        return tuple(p for p in inspect.signature(self.run).parameters if p not in shared)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("target-only", target_only, needs_draft=False, default_judge=None),
        Strategy("draft-only", draft_only, needs_draft=True, default_judge=None),
        Strategy("specreason", specreason, needs_draft=True, default_judge="score"),
        Strategy("lookahead", lookahead, needs_draft=True, default_judge="cascade", judge_sees_target_step=True),
        Strategy("spec-thinking", spec_thinking, needs_draft=True, default_judge=None),
        Strategy("arbitrage", arbitrage, needs_draft=True, default_judge=None, needs_router=True),
        Strategy("arbitrage-oracle", arbitrage_oracle, needs_draft=True, default_judge="score"),
    )
}


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        close = difflib.get_close_matches(name, list(STRATEGIES), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise StrategyError(f"unknown strategy '{name}'.{hint} Strategies: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def check_options(strategy: Strategy, options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(strategy.options))
    if unknown:
        takes = ", ".join(strategy.options) or "no options"
        raise StrategyError(f"strategy '{strategy.name}' has no option {', '.join(unknown)}; it takes: {takes}")
