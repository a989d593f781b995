"""Counters kept as ``{name: count}`` dicts (a trace's calls per engine, tool-call steps)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping


def summed(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The counts added key by key; a key that is 0 everywhere stays (``{"cut": 0}``).
    Example: ``summed([{"a": 1, "b": 0}, {"a": 2}])`` is ``{"a": 3, "b": 0}``."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(total)
