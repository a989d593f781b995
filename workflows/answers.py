"""Final-answer extraction, minimal: the last ``\\boxed{...}`` or the last number."""

from __future__ import annotations

import re

from orchestrator.steps import last_boxed

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def normalize_number(s: str) -> str | None:
    m = _NUMBER.findall(s.replace("$", ""))
    if not m:
        return None
    value = m[-1].replace(",", "")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return value


def extract_answer(response: str) -> str | None:
    """The model's final numeric answer: last boxed value, else the last number."""
    boxed = last_boxed(response)
    if boxed is not None:
        return normalize_number(boxed) or boxed
    return normalize_number(response)


def gsm8k_reference(solution: str) -> str:
    """The number after ``####`` in a GSM8K reference solution."""
    tail = solution.rsplit("####", 1)[-1]
    num = normalize_number(tail)
    if num is None:
        raise ValueError(f"GSM8K reference has no number after '####': {solution[-80:]!r}")
    return num
