"""The limits of one trace, declared once.

Every front end builds its budget here (CLI flags, YAML ``budget:`` blocks, bench
specs); the defaults below are the only ones. YAML files say ``timeout:`` for
``max_seconds``: both names are accepted.

    Budget()                                  # 64 steps, 1024 tokens, 256 a step
    Budget(max_tokens=512, timeout=30)        # the same as max_seconds=30
    Budget(max_steps=0)                       # ValueError: budget max_steps must be >= 1, got 0
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from common.names import did_you_mean


class Budget(BaseModel):
    """Limits of one trace (immutable and hashable). ``max_tokens`` counts the tokens of
    the trace's text. Bad values raise ``ValueError`` naming the field; an unknown field
    raises ``TypeError``, as a keyword a function does not take."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    max_steps: int = 64
    max_tokens: int = 1024
    max_step_tokens: int = 256
    max_seconds: float | None = Field(None, validation_alias=AliasChoices("max_seconds", "timeout"))
    # This many steps in a row cut by max_step_tokens, with the delimiter nowhere in
    # the trace, means the model does not separate steps that way: an error. None: allow.
    max_cut_steps: int | None = 4

    def __init__(self, **kwargs: Any) -> None:
        try:
            super().__init__(**kwargs)
        except ValidationError as e:
            raise _plain_error(e, list(type(self).model_fields)) from None

    @field_validator("max_steps", "max_tokens", "max_step_tokens")
    @classmethod
    def _at_least_one(cls, value: int, info: Any) -> int:
        if value < 1:
            raise ValueError(f"budget {info.field_name} must be >= 1, got {value}")
        return value

    @field_validator("max_cut_steps")
    @classmethod
    def _cut_steps(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"budget max_cut_steps must be >= 1 or None, got {value}")
        return value

    @field_validator("max_seconds")
    @classmethod
    def _seconds(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError(f"budget max_seconds must be > 0, got {value}")
        return value


def _plain_error(e: ValidationError, names: list[str]) -> Exception:
    """One readable error for a failed Budget: an unknown field as TypeError (with the
    closest name), a bad value as ValueError (the validator's own message)."""
    first = e.errors()[0]
    field = ".".join(str(x) for x in first["loc"])
    if first["type"] == "extra_forbidden":
        return TypeError(f"Budget got an unexpected keyword argument '{field}'.{did_you_mean(field, names)} "
                         f"Fields: {', '.join(names)} (timeout is max_seconds)")
    if first["type"] == "value_error":
        return ValueError(str(first["ctx"]["error"]))
    return ValueError(f"budget {field}: {first['msg']}, got {first.get('input')!r}")
