"""A reasoner's configuration, declared once; every entry point builds one.

* :class:`ReasonerSettings`: what a reasoner does, its engines aside: strategy and its
  options, judge, router, budget, delimiter (a YAML reasoner takes these same keys).
* :class:`ReasonerConfig`: those and its two engines (:data:`stepspec.engine.config.EngineConfig`).
  ``Reasoner.from_config(config)`` checks it (:func:`stepspec.orchestrator.reasoner.check_reasoner`:
  unknown names with the closest valid one, bad option values, a strategy without the
  draft it needs, an unknown model) before any model is prepared or loaded, then builds
  the engines and the reasoner.
* :class:`RunSettings`: the flat settings the front ends take (``stepspec solve``,
  ``bench`` and ``router collect`` flags, lm-eval's model_args, bench and collect specs):
  the engine pair (:class:`stepspec.engine.config.EnginePair`), the budget flags and the delimiter;
  :meth:`RunSettings.reasoner_config` makes the reasoner's config of them.

Every default is written once: here, in :mod:`stepspec.engine.config`, or in
:class:`stepspec.orchestrator.budget.Budget`; the command line's defaults and help come from
these fields.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from pydantic import Field, field_validator, model_validator

from stepspec.common.options import Frozen
from stepspec.engine.config import EngineConfig, EnginePair, like
from stepspec.judges.registry import JUDGES
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.strategies import STRATEGIES


class ReasonerSettings(Frozen):
    """What a reasoner does, its engines aside."""

    strategy: str = Field("specreason", description=f"{', '.join(STRATEGIES)}.")
    options: dict[str, Any] = Field(default_factory=dict, description="Strategy options (gamma, ...).")
    judge: str | None = Field(None, description=f"{', '.join(JUDGES)} (default: the strategy's).")
    judge_options: dict[str, Any] = Field(default_factory=dict, description="The judge's options (threshold, ...).")
    router: str | None = Field(None, description="arbitrage: 'threshold' or a router file from "
                               "`stepspec router train`.")
    router_options: dict[str, Any] = Field(default_factory=dict, description="The router's options (tau, ...).")
    budget: Budget = Field(default_factory=Budget, description="Limits of each trace.")
    delimiter: str = Field("\n\n", description="Step delimiter.")

    @field_validator("options", "judge_options", "router_options", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value


def engines_for(pair: EnginePair, strategy: str) -> tuple[Any, Any]:
    """The pair's (target, draft) engine configs for ``strategy``: ``target_spec="auto"`` is
    the token-level method the strategy declares (:attr:`stepspec.orchestrator.strategies.Strategy.target_spec`)."""
    known = STRATEGIES.get(strategy)
    return pair.engines(known.target_spec) if known else pair.engines()  # unknown: check_reasoner names it


@functools.cache
def _default_engines(strategy: str) -> tuple[Any, Any]:
    """The bundled pair's engine configs for ``strategy`` (frozen: one pair serves each default)."""
    return engines_for(EnginePair(), strategy)


class ReasonerConfig(ReasonerSettings):
    """A whole reasoner: its settings and its two engines (default: the bundled pair, with
    the target's token-level speculation its strategy's own, :func:`engines_for`)."""

    target: EngineConfig = Field(default_factory=lambda data: _default_engines(data["strategy"])[0],
                                 description="The target's engine.")
    draft: EngineConfig | None = Field(default_factory=lambda data: _default_engines(data["strategy"])[1],
                                       description="The draft's engine (strategies that draft steps).")
    max_concurrency: int = Field(8, ge=1, description="Problems in flight at once (solve_many).")

    @classmethod
    def from_keywords(cls, **keywords: Any) -> "ReasonerConfig":
        """A config from ``Reasoner``-style keywords: the config's own fields by name, any
        other keyword a strategy option (``gamma=3``)."""
        own = {k: v for k, v in keywords.items() if k in cls.model_fields and k != "options"}
        extra = {k: v for k, v in keywords.items() if k not in own}
        return cls(**own, options={**(own.pop("options", None) or {}), **extra})


class BudgetFlags(Frozen):
    """The budget as flags and spec keys spell it (``timeout`` for ``max_seconds``)."""

    max_tokens: int = like(Budget, "max_tokens", description="Token budget of a trace.")
    max_step_tokens: int = like(Budget, "max_step_tokens", description="Token cap of one step.")
    max_steps: int = like(Budget, "max_steps", description="Step budget of a trace.")
    timeout: float | None = like(Budget, "max_seconds", description="Wall-clock budget of a trace, seconds.")

    @model_validator(mode="after")
    def _valid(self) -> "BudgetFlags":
        self.budget()  # a bad value fails here, with the budget's own message
        return self

    def budget(self) -> Budget:
        return Budget(max_tokens=self.max_tokens, max_step_tokens=self.max_step_tokens, max_steps=self.max_steps,
                      max_seconds=self.timeout)


class RunSettings(EnginePair, BudgetFlags):
    """The flat settings every front end takes: the engine pair, the budget, the delimiter."""

    delimiter: str = like(ReasonerSettings, "delimiter")

    def reasoner_config(self, **settings: Any) -> ReasonerConfig:
        """The reasoner's config: these engines, budget and delimiter, and ``settings``
        (``Reasoner`` keywords: strategy, judge, ..., strategy options)."""
        target, draft = engines_for(self, settings.get("strategy", ReasonerSettings.model_fields["strategy"].default))
        return ReasonerConfig.from_keywords(target=target, draft=draft, budget=self.budget(),
                                            delimiter=self.delimiter, **settings)

    @classmethod
    def split(cls, keywords: Mapping[str, Any]) -> tuple["RunSettings", dict[str, Any]]:
        """(the run settings among ``keywords``, the rest)."""
        mine = {k: v for k, v in keywords.items() if k in cls.model_fields}
        return cls(**mine), {k: v for k, v in keywords.items() if k not in mine}


def strategy_table() -> str:
    """The strategies as a markdown table: each name, who writes a step, its default judge (a
    router where a router decides), the default strategy (:class:`ReasonerSettings`') marked."""
    default = ReasonerSettings.model_fields["strategy"].default
    rows = ["| strategy | who writes a step | default judge |", "|---|---|---|"]
    for s in STRATEGIES.values():
        judge = f"`{s.default_judge}`" if s.default_judge else "a router" if s.needs_router else "-"
        rows.append(f"| `{s.name}`{' (the default)' if s.name == default else ''} | {s.writes} | {judge} |")
    return "\n".join(rows) + "\n"
