"""Routers by name or file: ``threshold``, or the path of a trained router file."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
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
            _check_options(spec, options, ThresholdRouter)
            return ThresholdRouter(**options)
        if spec.endswith((".pt", ".router")) or Path(spec).exists() or "/" in spec:
            from routers.learned import LearnedRouter

            _check_options(spec, options, LearnedRouter.load)
            return LearnedRouter.load(spec, **options)
    except TypeError as e:
        raise RouterError(f"router '{spec}': bad option: {e}") from e
    close = difflib.get_close_matches(spec, ["threshold"], n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise RouterError(f"unknown router '{spec}'.{hint} Give 'threshold' or the path of a router file "
                      "(train one with `stepspec router train`)")


def _check_options(spec: str, options: dict[str, Any], build: Callable[..., Router]) -> None:
    """Every option is a keyword of ``build`` (the router's constructor or loader)."""
    valid = [p for p in inspect.signature(build).parameters if p != "path"]
    unknown = [o for o in options if o not in valid]
    if unknown:
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise RouterError(f"router '{spec}' has no option '{unknown[0]}'.{hint} Its options: {', '.join(valid)}")
