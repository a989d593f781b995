"""Named token-level speculation methods, turned into vLLM ``speculative_config``.

Users may always pass a full ``speculative_config`` mapping instead; it goes to
vLLM untouched. These names are shorthands for the common cases:

* ``none``: no token-level speculation.
* ``ngram``: prompt-lookup decoding: propose the tokens that followed the last
  matching n-gram of the context (no model).
* ``suffix``: suffix decoding (needs ``arctic-inference``): a suffix tree over the
  prompt and earlier outputs proposes continuations.
* ``draft``: a smaller model of the same tokenizer proposes tokens
  (``draft_model`` is required; the bundled pair uses the 0.5B for the 1.5B).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class TokenMethod(StrEnum):
    """Token-level speculative decoding inside one vLLM engine."""

    NONE = "none"
    NGRAM = "ngram"  # prompt lookup
    SUFFIX = "suffix"  # suffix decoding (arctic-inference)
    DRAFT = "draft"  # a smaller model of the same tokenizer drafts the tokens


METHODS = tuple(m.value for m in TokenMethod)
# The engine pair's target_spec default: the method the strategy declares for itself.
AUTO_SPEC = "auto"


def speculative_config(
    method: TokenMethod | str, *, draft_model: str | None = None, num_speculative_tokens: int | None = None
) -> dict[str, Any] | None:
    """The vLLM ``speculative_config`` for a method (None for ``none``)."""
    if method not in METHODS:
        raise ValueError(f"unknown speculation method '{method}'; choose one of: {', '.join(METHODS)}")
    method = TokenMethod(method)
    if method is TokenMethod.NONE:
        return None
    if method is TokenMethod.NGRAM:
        return {
            "method": "ngram",
            "num_speculative_tokens": num_speculative_tokens or 3,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    if method is TokenMethod.SUFFIX:
        return {"method": "suffix", "num_speculative_tokens": num_speculative_tokens or 8}
    if not draft_model:
        raise ValueError("speculation method 'draft' needs a draft model (a preset, path or hub id)")
    return {"model": draft_model, "num_speculative_tokens": num_speculative_tokens or 3}


def suffix_available() -> bool:
    """Whether suffix decoding can run (arctic-inference is importable)."""
    import importlib.util

    return importlib.util.find_spec("arctic_inference") is not None
