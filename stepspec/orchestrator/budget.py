"""The limits of one trace, declared once.

Every front end builds its budget here (CLI flags, YAML ``budget:`` blocks, bench
specs); the defaults below are the only ones. YAML files say ``timeout:`` for
``max_seconds``: both names are accepted.

    Budget()                                  # 64 steps, 1024 tokens, 256 a step
    Budget(max_tokens=512, timeout=30)        # the same as max_seconds=30
    Budget(max_steps=0)                       # ValueError: budget: max_steps must be an integer >= 1, got 0
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from stepspec.common.options import explain


class Budget(BaseModel):
    """Limits of one trace (immutable and hashable). ``max_tokens`` counts the tokens of
    the trace's text. Bad values raise ``ValueError`` naming the field; an unknown field
    raises ``TypeError``, as a keyword a function does not take."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    max_steps: int = Field(64, ge=1)
    max_tokens: int = Field(1024, ge=1)
    max_step_tokens: int = Field(256, ge=1)
    max_seconds: float | None = Field(None, gt=0, validation_alias=AliasChoices("max_seconds", "timeout"))
    # This many steps in a row cut by max_step_tokens, with the delimiter nowhere in
    # the trace, means the model does not separate steps that way: an error. None: allow.
    max_cut_steps: int | None = Field(4, ge=1)

    def __init__(self, **kwargs: Any) -> None:
        try:
            super().__init__(**kwargs)
        except ValidationError as e:
            unknown = e.errors()[0]["type"] == "extra_forbidden"
            raise (TypeError if unknown else ValueError)(explain(type(self), e, "budget")) from None
