"""Routers by name or file: ``threshold``, or the path of a trained router file.

Each router registers itself beside its class (``@router(name, Options)``,
:func:`stepspec.routers.base.router`) with its options model (every option with its one
default); importing this module imports every router module, so :data:`ROUTERS` is full
here. :func:`router_options_model` lets an entry point check options without building
the router (a router file is not read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepspec.common.registry import options_line
# Each router module registers its router when imported.
from stepspec.routers import threshold  # noqa: F401
from stepspec.routers.base import ROUTERS, Router, RouterEntry, RouterError, RouterOptions
from stepspec.routers.learned import LearnedOptions, LearnedRouter

__all__ = ["ROUTERS", "RouterEntry", "make_router", "router_options_model", "router_table"]


def router_table() -> str:
    """The routers as a markdown table (the docs' table): each name, what it routes by, its options
    with their defaults; a trained router file last."""
    rows = ["| router | routes by | options (defaults) |", "|---|---|---|"]
    rows += [f"| `{e.name}` | {e.about} | {options_line(e.options_model)} |" for e in ROUTERS.values()]
    rows.append(f"| a file from `stepspec router train` | a trained network's probability that the target writes a "
                f"better step | {options_line(LearnedOptions)} |")
    return "\n".join(rows) + "\n"


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
        return ROUTERS[spec].router(validated)
    return LearnedRouter.load(spec, validated)
