"""``target-only`` and ``draft-only``: one model writes every step.

The baselines every speculative strategy is measured against; they go through
the same step machinery, so their text is what a strategy produces when its
judge always sides with one model.
"""

from __future__ import annotations

from typing import Any

from engine.protocol import Engine
from orchestrator.driver import Policy, StrategyOptions, drive
from orchestrator.run import TraceRun
from orchestrator.trace import Author, Trace


class OneModel(Policy):
    """Every step, and the answer after </think>, by one model."""

    def __init__(self, author: Author) -> None:
        self.author = self.answerer = author
        self.name = f"{author}-only"

    async def step(self, run: TraceRun) -> None:
        run.keep(self.author, await run.write(self.author))


async def target_only(question: str, *, target: Engine, **shared: Any) -> Trace:
    """``shared``: the driver's ``rules``, ``budget``, ``on_step``; no options of its own."""
    return await drive(OneModel(Author.TARGET), question, {"target": target}, **shared)


async def draft_only(question: str, *, draft: Engine, target: Engine | None = None, **shared: Any) -> Trace:
    """The draft alone (``target`` is accepted, as every strategy gets one, and unused)."""
    return await drive(OneModel(Author.DRAFT), question, {"draft": draft}, **shared)


NoOptions = StrategyOptions  # target-only and draft-only take none
