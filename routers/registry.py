"""Routers by name or file: ``threshold``, or the path of a trained router file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from routers.base import Router, RouterError
from routers.threshold import ThresholdRouter


def make_router(spec: str | Router, **options: Any) -> Router:
    """``spec``: "threshold" (options: min_confidence, statistic), a router file from
    ``stepspec router train`` (option: tau, overriding the saved one), or a Router."""
    if not isinstance(spec, str):
        if options:
            raise RouterError("router options apply to a router given by name or file, not to a router object")
        if not isinstance(spec, Router):
            raise RouterError(f"{spec!r} is not a router: it needs a name and an async route(states) method")
        return spec
    try:
        if spec == "threshold":
            return ThresholdRouter(**options)
        if spec.endswith((".pt", ".router")) or Path(spec).exists() or "/" in spec:
            from routers.learned import LearnedRouter

            return LearnedRouter.load(spec, **options)
    except TypeError as e:
        raise RouterError(f"router '{spec}': bad option: {e}") from e
    raise RouterError(f"unknown router '{spec}': give 'threshold' or the path of a router file "
                      "(train one with `stepspec router train`)")
