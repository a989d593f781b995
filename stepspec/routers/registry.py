"""Routers by name or file: ``threshold``, or the path of a trained router file.

Each maps to its options model (every option with its one default) and a builder;
:func:`router_options_model` lets an entry point check options without building
the router (a router file is not read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepspec.common.registry import Entry, Registry
from stepspec.routers.base import Router, RouterError, RouterOptions
from stepspec.routers.learned import LearnedOptions, LearnedRouter
from stepspec.routers.threshold import ThresholdOptions, ThresholdRouter


@dataclass(frozen=True)
class RouterEntry(Entry):
    build: Callable[[Any], Router]  # validated options -> the router


ROUTERS: Registry[RouterEntry] = Registry("router", RouterError, entries=(
    RouterEntry("threshold", ThresholdOptions, ThresholdRouter),
), hint="Give 'threshold' or the path of a router file (train one with `stepspec router train`)")


def _is_router_file(spec: str) -> bool:
    return spec.endswith((".pt", ".router")) or "/" in spec or Path(spec).exists()


def router_options_model(spec: str) -> type[RouterOptions]:
    """The options model of router ``spec`` (a name, or a router file's path)."""
    if spec not in ROUTERS and _is_router_file(spec):
        return LearnedOptions
    return ROUTERS.find(spec).options_model


def make_router(spec: str | Router, **options: Any) -> Router:
    """``spec``: "threshold" (options: min_confidence, statistic), a router file from
    ``stepspec router train`` (option: tau, overriding the saved one), or a Router."""
    if not isinstance(spec, str):
        if options:
            raise RouterError("router options apply to a router given by name or file, not to a router object")
        if not isinstance(spec, Router):
            raise RouterError(f"{spec!r} is not a router: it needs a name and an async route(states) method")
        return spec
    validated = router_options_model(spec).parse(options, owner=f"router '{spec}'")
    if spec in ROUTERS:
        return ROUTERS[spec].build(validated)
    return LearnedRouter.load(spec, validated)
