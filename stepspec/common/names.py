"""Did-you-mean: the closest valid name to a wrong one, for error messages.

    >>> did_you_mean("specreasn", ["specreason", "lookahead"])
    " Did you mean 'specreason'?"
    >>> did_you_mean("xyz", ["specreason"])
    ''
"""

from __future__ import annotations

import difflib
from typing import Iterable


def closest(name: object, choices: Iterable[object], cutoff: float = 0.6) -> str | None:
    """The valid choice nearest to ``name`` (compared as text), or None if none is near."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(name: object, choices: Iterable[object], cutoff: float = 0.6) -> str:
    """`` Did you mean 'X'?`` for the nearest choice, or an empty string."""
    match = closest(name, choices, cutoff)
    return f" Did you mean '{match}'?" if match else ""
