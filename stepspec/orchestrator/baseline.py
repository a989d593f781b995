"""``target-only`` and ``draft-only``: one model writes every step.

The baselines every speculative strategy is measured against; they go through
the same step machinery, so by default (a call per step) their text is what a
strategy produces when its judge always sides with one model. ``run_tokens``: the
model writes up to that many tokens in one generation, kept as the steps it holds,
as it would alone without steps (no call per step). Example, ``run_tokens=640`` and a
640-token budget: one call writes the whole trace, split at the delimiter into its
steps, up to the one with the answer.
"""

from __future__ import annotations

from pydantic import Field

from stepspec.orchestrator.driver import Policy, StrategyOptions
from stepspec.orchestrator.registry import strategy
from stepspec.orchestrator.run import TraceRun
from stepspec.orchestrator.trace import Author


class OneModelOptions(StrategyOptions):
    run_tokens: int = Field(0, ge=0, description="the model writes up to this many tokens in one generation, kept "
                            "as the steps it holds (no call per step); 0: one step per call")


class OneModel(Policy):
    """Every step, and the answer after </think>, by one model (``author``)."""

    author: Author
    options: OneModelOptions

    async def step(self, run: TraceRun) -> None:
        await run.write_on(self.author, self.options.run_tokens)


@strategy("target-only", OneModelOptions, needs_draft=False,
          writes="the target, always (the baseline)")
class TargetOnly(OneModel):
    author = Author.TARGET


@strategy("draft-only", OneModelOptions, needs_target=False, writes="the draft, always (the pair's speed ceiling)")
class DraftOnly(OneModel):
    author = answerer = Author.DRAFT
