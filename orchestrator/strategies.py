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
tree             beam search: the draft proposes k steps per branch,    yes   score
                 the judge rates all in one batch, the best b go on
tree-target      the same search with the target proposing (baseline)   -     score
best-of-n        n drafted solutions, a vote, the target breaks ties    yes   score
best-of-n-target n solutions the target samples, the same vote          -     score
================ ====================================================== ===== =======
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from orchestrator.arbitrage import arbitrage, arbitrage_oracle
from orchestrator.baseline import draft_only, target_only
from orchestrator.best_of_n import best_of_n, best_of_n_target
from orchestrator.lookahead import lookahead
from orchestrator.spec_thinking import spec_thinking
from orchestrator.specreason import specreason
from orchestrator.tree import tree, tree_target
from orchestrator.trace import Trace


class StrategyError(ValueError):
    """An unknown strategy, or options it does not take."""


@dataclass(frozen=True)
class Strategy:
    name: str
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

    @property
    def options(self) -> tuple[str, ...]:
        """Keyword options of the strategy itself (not the shared question/engines/rules/budget)."""
        shared = {"question", "draft", "target", "judge", "router", "rules", "budget", "on_step", "on_example",
                  "problem_id", "proposer", "sampler", "governor"}
        params = inspect.signature(self.run).parameters.values()
        return tuple(p.name for p in params if p.name not in shared and p.kind is not p.VAR_KEYWORD)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("target-only", target_only, needs_draft=False, default_judge=None),
        Strategy("draft-only", draft_only, needs_draft=True, default_judge=None, needs_target=False),
        Strategy("specreason", specreason, needs_draft=True, default_judge="likelihood"),
        Strategy("lookahead", lookahead, needs_draft=True, default_judge="cascade", judge_sees_target_step=True),
        Strategy("spec-thinking", spec_thinking, needs_draft=True, default_judge=None),
        Strategy("arbitrage", arbitrage, needs_draft=True, default_judge=None, needs_router=True),
        Strategy("arbitrage-oracle", arbitrage_oracle, needs_draft=True, default_judge="score"),
        Strategy("tree", tree, needs_draft=True, default_judge="score", queued_judge=True),
        Strategy("tree-target", tree_target, needs_draft=False, default_judge="score", queued_judge=True),
        Strategy("best-of-n", best_of_n, needs_draft=True, default_judge="score", queued_judge=True),
        Strategy("best-of-n-target", best_of_n_target, needs_draft=False, default_judge="score", queued_judge=True),
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
        close = difflib.get_close_matches(unknown[0], strategy.options, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise StrategyError(f"strategy '{strategy.name}' has no option {', '.join(unknown)}{hint}; it takes: {takes}")
