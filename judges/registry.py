"""Judges by name: ``score``, ``likelihood``, ``exact``, ``embedding``, ``llm-equivalence``, ``cascade``."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable

from engine.protocol import Engine
from judges.base import Judge, JudgeError
from judges.cascade import CascadeJudge
from judges.embedding import EmbeddingJudge
from judges.equivalence import LLMEquivalenceJudge
from judges.exact import ExactJudge
from judges.likelihood import LikelihoodJudge
from judges.score import ScoreJudge


def _cascade(engine: Engine | None, rungs: tuple[str, ...] = ("exact", "embedding", "score"),
             **options: Any) -> CascadeJudge:
    return CascadeJudge([make_judge(r, engine=engine, **options.get(r, {})) for r in rungs])


def _needs_engine(name: str, factory: Callable[..., Judge]) -> Callable[..., Judge]:
    def build(engine: Engine | None, **options: Any) -> Judge:
        if engine is None:
            raise JudgeError(f"judge '{name}' asks a model; give it an engine (the target's, usually)")
        return factory(engine, **options)

    return build


# The class behind each name, whose constructor keywords are the judge's options.
JUDGE_CLASSES: dict[str, type] = {"score": ScoreJudge, "likelihood": LikelihoodJudge, "exact": ExactJudge,
                                  "embedding": EmbeddingJudge, "llm-equivalence": LLMEquivalenceJudge}


def judge_options(name: str) -> tuple[str, ...]:
    """The options judge ``name`` takes (a cascade: ``rungs`` and one mapping per rung)."""
    if name == "cascade":
        return ("rungs", *JUDGE_CLASSES)
    params = inspect.signature(JUDGE_CLASSES[name]).parameters.values()
    return tuple(p.name for p in params if p.name != "engine")


JUDGES: dict[str, Callable[..., Judge]] = {
    "score": _needs_engine("score", ScoreJudge),
    "likelihood": _needs_engine("likelihood", LikelihoodJudge),
    "exact": lambda engine, **options: ExactJudge(**options),
    "embedding": lambda engine, **options: EmbeddingJudge(**options),
    "llm-equivalence": _needs_engine("llm-equivalence", LLMEquivalenceJudge),
    "cascade": _cascade,
}


def make_judge(name: str, *, engine: Engine | None = None, **options: Any) -> Judge:
    """Build a judge by name; ``options`` go to its constructor (a cascade takes
    ``rungs`` and per-rung option mappings keyed by rung name)."""
    if name not in JUDGES:
        close = difflib.get_close_matches(name, list(JUDGES), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise JudgeError(f"unknown judge '{name}'.{hint} Judges: {', '.join(JUDGES)}")
    valid = judge_options(name)
    unknown = [o for o in options if o not in valid]
    if unknown:
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise JudgeError(f"judge '{name}' has no option '{unknown[0]}'.{hint} Its options: {', '.join(valid)}")
    try:
        return JUDGES[name](engine, **options)
    except TypeError as e:
        raise JudgeError(f"judge '{name}': bad option: {e}") from e
