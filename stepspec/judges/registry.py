"""Judges by name: ``score``, ``likelihood``, ``exact``, ``embedding``, ``llm-equivalence``, ``cascade``.

Each judge registers itself beside its class (``@judge(name, Options)``,
:func:`stepspec.judges.base.judge`): its options model (every option with its one
default) and whether it asks a model. Importing this module imports every judge module,
so :data:`JUDGES` is full here. An entry point (CLI, workflow file, lm-eval) can check options with
:func:`judge_options_model` without building the judge.
"""

from __future__ import annotations

from typing import Any

from stepspec.common.registry import options_line
from stepspec.engine.protocol import Engine
# Each judge module registers its judge when imported; listed in the order below.
from stepspec.judges import cascade, embedding, equivalence, exact, likelihood, score  # noqa: F401
from stepspec.judges.base import JUDGES, Judge, JudgeEntry, JudgeOptions

JUDGES.order(["score", "likelihood", "exact", "embedding", "llm-equivalence", "cascade"])

__all__ = ["JUDGES", "JudgeEntry", "judge_options", "judge_options_model", "judge_table", "make_judge"]


def judge_table() -> str:
    """The judges as a markdown table (the docs' table): each name, what it decides by, whether
    it asks a model, its options with their defaults."""
    rows = ["| judge | decides by | asks a model | options (defaults) |", "|---|---|---|---|"]
    for e in JUDGES.values():
        rows.append(f"| `{e.name}` | {e.about} | {'yes' if e.needs_engine else 'no'} | {options_line(e.options_model)} |")
    return "\n".join(rows) + "\n"


def judge_options_model(name: str) -> type[JudgeOptions]:
    """The options model of judge ``name``: validate options with it without building the judge."""
    return JUDGES.find(name).options_model


def judge_options(name: str) -> tuple[str, ...]:
    """The options judge ``name`` takes (a cascade: ``rungs`` and one mapping per rung)."""
    return judge_options_model(name).names()


def make_judge(name: str, *, engine: Engine | None = None, **options: Any) -> Judge:
    """Build a judge by name; ``options`` are validated by its options model (a cascade
    takes ``rungs`` and per-rung option mappings keyed by rung name)."""
    validated = judge_options_model(name).build(None, **options)
    return JUDGES[name].build(engine, validated)
