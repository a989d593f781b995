"""Judges by name: ``score``, ``likelihood``, ``exact``, ``embedding``, ``llm-equivalence``, ``cascade``.

Each name maps to the judge's options model (declared beside the judge, every
option with its one default) and a builder taking the engine and validated
options. An entry point (CLI, workflow file, lm-eval) can check options with
:func:`judge_options_model` without building the judge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from common.registry import Entry, Registry
from engine.protocol import Engine
from judges.base import Judge, JudgeError, JudgeOptions
from judges.cascade import CascadeJudge, CascadeOptions
from judges.embedding import EmbeddingJudge, EmbeddingOptions
from judges.equivalence import LLMEquivalenceJudge, LLMEquivalenceOptions
from judges.exact import ExactJudge, ExactOptions
from judges.likelihood import LikelihoodJudge, LikelihoodOptions
from judges.score import ScoreJudge, ScoreOptions


@dataclass(frozen=True)
class JudgeEntry(Entry):
    build: Callable[[Engine | None, Any], Judge]  # (engine, validated options) -> the judge


def _needs_engine(name: str, judge_class: Callable[[Engine, Any], Judge]) -> Callable[[Engine | None, Any], Judge]:
    def build(engine: Engine | None, options: Any) -> Judge:
        if engine is None:
            raise JudgeError(f"judge '{name}' asks a model; give it an engine (the target's, usually)")
        return judge_class(engine, options)

    return build


def _cascade(engine: Engine | None, options: CascadeOptions) -> CascadeJudge:
    return CascadeJudge([JUDGES[r].build(engine, options.rung_options(r)) for r in options.rungs])


JUDGES: Registry[JudgeEntry] = Registry("judge", JudgeError, entries=(
    JudgeEntry("score", ScoreOptions, _needs_engine("score", ScoreJudge)),
    JudgeEntry("likelihood", LikelihoodOptions, _needs_engine("likelihood", LikelihoodJudge)),
    JudgeEntry("exact", ExactOptions, lambda engine, options: ExactJudge(options)),
    JudgeEntry("embedding", EmbeddingOptions, lambda engine, options: EmbeddingJudge(options)),
    JudgeEntry("llm-equivalence", LLMEquivalenceOptions, _needs_engine("llm-equivalence", LLMEquivalenceJudge)),
    JudgeEntry("cascade", CascadeOptions, _cascade),
))


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
