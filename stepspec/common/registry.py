"""Plug-ins by name, one shape for every kind (strategies, judges, routers).

A :class:`Registry` maps each name to its :class:`Entry`: the name, the options model (every
option with its one default, :class:`stepspec.common.options.Options`) and what the kind needs beside
it (a judge's or router's builder, a strategy's policy and needs). It reads as a mapping;
:meth:`Registry.find` is the lookup that names an unknown name, the closest known one, and
every name there is, in the kind's own error.

Worked example::

    JUDGES = Registry("judge", JudgeError)
    JUDGES.add(JudgeEntry("score", ScoreOptions, ScoreJudge))   # what @judge("score", ScoreOptions) does
    JUDGES.find("scroe")   # JudgeError: unknown judge 'scroe'. Did you mean 'score'? Judges: score, ...
    "score" in JUDGES      # True; list(JUDGES) gives the names in declaration order
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from stepspec.common.names import did_you_mean


@dataclass(frozen=True)
class Entry:
    """What every registered plug-in declares: its name and its options model."""

    name: str
    options_model: type[Any]


def options_line(options_model: type[Any]) -> str:
    """An options model's options with their defaults, for a docs table: ``floor=-5.0, top_k=5``; a
    long text default (a prompt) or a nested options model shows its name alone, an option without
    a default ``name=...``."""
    shown = []
    for name, f in options_model.model_fields.items():
        default = f.get_default(call_default_factory=True) if not f.is_required() else ...
        if default is ...:
            shown.append(f"`{name}=...`")
        elif (isinstance(default, str) and (len(default) > 24 or "\n" in default)) or \
                hasattr(type(default), "model_fields"):
            shown.append(f"`{name}`")
        else:
            shown.append(f"`{name}={default!r}`")
    return ", ".join(shown) or "-"


E = TypeVar("E", bound=Entry)


class Registry(Mapping[str, E], Generic[E]):
    """Entries of one kind by name, in declaration order; ``error``: the kind's error class;
    ``plural``: how the unknown-name message lists them; ``hint``: what else the kind accepts."""

    def __init__(self, kind: str, error: type[Exception], *, entries: Iterable[E] = (), plural: str | None = None,
                 hint: str = "") -> None:
        self.kind, self.error, self.hint = kind, error, hint
        self.plural = plural or f"{kind.capitalize()}s"
        self._entries: dict[str, E] = {}
        for entry in entries:
            self.add(entry)

    def add(self, entry: E) -> None:
        """Register ``entry`` (a plug-in registering itself, or a declared entry); a name taken is an error."""
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} '{entry.name}' is registered twice")
        self._entries[entry.name] = entry

    def order(self, names: Iterable[str]) -> None:
        """List ``names`` first, in that order, then any other entry as it registered: plug-ins
        that register themselves when their module is imported are listed in the declared order,
        whichever module a process imported first."""
        names = list(names)
        if missing := [n for n in names if n not in self._entries]:
            raise ValueError(f"{self.kind} order names {missing}, which are not registered")
        self._entries = {name: self._entries[name] for name in [*names, *self._entries]}

    def __getitem__(self, name: str) -> E:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, name: str) -> E:
        """The entry named ``name``; an unknown name is the kind's error, with the closest name."""
        if name not in self._entries:
            raise self.error(f"unknown {self.kind} '{name}'.{did_you_mean(name, self._entries)} "
                             + (self.hint or f"{self.plural}: {', '.join(self._entries)}"))
        return self._entries[name]
