"""Options models: each configurable thing declares its options once, with their defaults.

An :class:`Options` subclass is a frozen pydantic model that refuses unknown keys;
every field carries its one default, its constraints and a description. Building
one from keywords (:meth:`Options.build`, :meth:`Options.parse`) turns pydantic's
validation error into the owner's own error, naming the option and what it must be.

Worked example, ``class ScoreOptions(Options)`` with ``owner = "judge 'score'"`` and
``threshold: float = Field(7.0, ge=0, le=9)``:

* ``ScoreOptions.build(threshold=12)``: "judge 'score': threshold must be within 0..9, got 12";
* ``ScoreOptions.build(treshold=6)``: "judge 'score' has no option 'treshold'. Did you mean
  'threshold'? Its options: threshold, ...".
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Self

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from stepspec.common.names import closest, did_you_mean


class Frozen(BaseModel):
    """Base of every user-facing settings model (an engine's, a reasoner's, a workflow file's
    parts): frozen, unknown keys refused; an enum field holds its string value (equal to the
    member), so a dump stays plain."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=True)


class Options(BaseModel):
    """Base of an options model: frozen, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    owner: ClassVar[str] = "options"  # who takes them, for messages: "judge 'score'"
    error: ClassVar[type[Exception]] = ValueError  # what a mistake raises

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, as given in keywords and files (aliases where a field has one)."""
        return tuple(f.alias or n for n, f in cls.model_fields.items())

    @classmethod
    def build(cls, options: Options | Mapping[str, Any] | None = None, **overrides: Any) -> Self:
        """``options`` (a model, a mapping, or None: every default) with ``overrides`` on top, validated."""
        if isinstance(options, cls) and not overrides:
            return options
        return cls.parse({**_as_mapping(options), **overrides})

    @classmethod
    def parse(cls, data: Mapping[str, Any], owner: str | None = None) -> Self:
        """Validate ``data``; a mistake raises ``cls.error`` with what :func:`explain` says."""
        try:
            return cls.model_validate(dict(data))
        except ValidationError as e:
            raise cls.error(explain(cls, e, owner or cls.owner)) from None


class Configured:
    """An object built from an options model: its options read as attributes
    (``judge.threshold`` is ``judge.options.threshold``)."""

    options: Options

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__.get("options")
        if options is not None and name in type(options).model_fields:
            return getattr(options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def _as_mapping(options: Options | Mapping[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return {}
    if isinstance(options, BaseModel):
        return options.model_dump(by_alias=True)
    if isinstance(options, Mapping):
        return dict(options)
    raise TypeError(f"options must be an options model or a mapping of option names to values, not {options!r}")


M = typing.TypeVar("M", bound=BaseModel)


def checked(model: type[M], owner: str, /, **values: Any) -> M:
    """``model(**values)``; a value it refuses is a ValueError worded by :func:`explain`
    (the one place a refused setting is put in words). Example: ``checked(BenchSettings, "bench",
    limit=0)`` raises "bench: limit must be an integer >= 1, or None, got 0"."""
    try:
        return model(**values)
    except ValidationError as e:
        raise ValueError(explain(model, e, owner)) from None


def explain(model: type[BaseModel], error: ValidationError, owner: str) -> str:
    """The first mistake of ``error`` in words: the option (``score.threshold`` inside a
    nested model), what it must be (read from its declared constraints, else pydantic's
    message) and the value given."""
    e = error.errors(include_url=False)[0]
    loc, kind, value = e["loc"], e["type"], e.get("input")
    parent, field = _walk(model, loc[:-1]), None
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    if kind in ("value_error", "assertion_error"):  # a validator's own words
        msg = e["msg"].split(", ", 1)[-1]
        return f"{owner}: {path}: {msg}" if path else f"{owner}: {msg}"
    if not loc:
        return f"{owner}: {e['msg']}"
    if kind == "extra_forbidden" and parent is not None:
        names = parent.names() if issubclass(parent, Options) else tuple(parent.model_fields)
        prefix = path[: len(path) - len(str(loc[-1]))]
        match = closest(loc[-1], names)
        hint = f" Did you mean '{prefix}{match}'?" if match else ""
        listing = f"Options of '{prefix.rstrip('.')}'" if prefix else "Its options"
        return (f"{owner} has no option '{path}'.{hint} " + (f"{listing}: {', '.join(names)}" if names
                                                            else "It takes no options."))
    if parent is not None and isinstance(loc[-1], str):
        field = _field(parent, loc[-1])
    elif isinstance(loc[-1], int) and len(loc) >= 2:  # an item of a sequence field
        owner_model = _walk(model, loc[:-2])
        field = _item_field(_field(owner_model, loc[-2])) if owner_model else None
    must = accepted(field) if field is not None else None
    if must is None:
        return f"{owner}: {path}: {e['msg']}, got {value!r}"
    hint = did_you_mean(value, _literal_values(field.annotation)) if kind in ("literal_error", "enum") else ""
    detail = f" ({e['msg']})" if kind.endswith(("_type", "_parsing", "_from_float")) else ""
    return f"{owner}: {path} must be {must}, got {value!r}{detail}" + (f".{hint}" if hint else "")


def accepted(field: FieldInfo) -> str | None:
    """What a field accepts, in words: ``within 0..9``, ``an integer >= 1, or None``,
    ``'mean' or 'min'``; None when it cannot be said simply."""
    base, nullable = strip_none(field.annotation)
    bounds = {type(m).__name__.lower(): getattr(m, type(m).__name__.lower())
              for m in field.metadata if isinstance(m, (Ge, Gt, Le, Lt))}
    words = [w for w in (_kind(base, bool(bounds)), _bounds(bounds)) if w]
    if not words:
        return None
    return " ".join(words) + (", or None" if nullable else "")


def _kind(base: Any, bounded: bool) -> str | None:
    if typing.get_origin(base) is Literal:
        values = [repr(v) for v in typing.get_args(base)]
        return " or ".join(values) if len(values) <= 2 else f"one of {', '.join(values)}"
    return {int: "an integer", float: None if bounded else "a number", str: "text", bool: "true or false"}.get(base)


def _bounds(b: dict[str, Any]) -> str | None:
    num = "{:g}".format
    if "ge" in b and "le" in b:
        return f"within {num(b['ge'])}..{num(b['le'])}"
    if "gt" in b and "lt" in b:
        return f"within ({num(b['gt'])}, {num(b['lt'])})"
    words = [f"{op} {num(b[k])}" for k, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if k in b]
    return " and ".join(words) or None


def strip_none(annotation: Any) -> tuple[Any, bool]:
    """A field's type without its None, and whether it took None: ``int | None`` -> (int, True)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def _literal_values(annotation: Any) -> tuple[Any, ...]:
    """The values a Literal or an Enum field takes."""
    base, _ = strip_none(annotation)
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return tuple(m.value for m in base)
    return typing.get_args(base) if typing.get_origin(base) is Literal else ()


def _field(model: type[BaseModel], key: str) -> FieldInfo | None:
    return next((f for n, f in model.model_fields.items() if key in (n, f.alias, *_choices(f))), None)


def _choices(field: FieldInfo) -> tuple[str, ...]:
    """The names a field is also read under (``AliasChoices``)."""
    alias = field.validation_alias
    return tuple(c for c in getattr(alias, "choices", ()) if isinstance(c, str))


def _item_field(field: FieldInfo | None) -> FieldInfo | None:
    """The field an item of a ``tuple[X, ...]`` field would be, to describe X."""
    if field is None:
        return None
    args = [a for a in typing.get_args(strip_none(field.annotation)[0]) if a is not Ellipsis]
    return FieldInfo.from_annotation(args[0]) if len(args) == 1 else None


def _walk(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The nested model at ``loc`` (field names), or None when ``loc`` leaves the models."""
    for key in loc:
        field = _field(model, key) if isinstance(key, str) else None
        inner = strip_none(field.annotation)[0] if field is not None else None
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return None
        model = inner
    return model
