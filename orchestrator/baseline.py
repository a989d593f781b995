"""``target-only`` and ``draft-only``: one model writes every step.

The baselines every speculative strategy is measured against; they go through
the same step machinery, so their text is what a strategy produces when its
judge always sides with one model.
"""

from __future__ import annotations

from orchestrator.driver import Policy
from orchestrator.registry import strategy
from orchestrator.run import TraceRun
from orchestrator.trace import Author


class OneModel(Policy):
    """Every step, and the answer after </think>, by one model (``author``); no options."""

    author: Author

    async def step(self, run: TraceRun) -> None:
        run.keep(self.author, await run.write(self.author))


@strategy("target-only", needs_draft=False)
class TargetOnly(OneModel):
    author = Author.TARGET


@strategy("draft-only", needs_target=False)
class DraftOnly(OneModel):
    author = answerer = Author.DRAFT
