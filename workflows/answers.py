"""Final-answer extraction, minimal: the last ``\\boxed{...}`` or the last number."""

from __future__ import annotations

from judges.exact import numbers_in
from orchestrator.steps import last_boxed


def normalize_number(s: str) -> str | None:
    """The last number in ``s``, canonical (no $ or thousands separators, no trailing
    decimal zeros); None if there is none."""
    numbers = numbers_in(s.replace("$", ""))
    return numbers[-1] if numbers else None


def extract_answer(response: str) -> str | None:
    """The model's final numeric answer: last boxed value, else the last number."""
    boxed = last_boxed(response)
    if boxed is not None:
        return normalize_number(boxed) or boxed
    return normalize_number(response)


def trace_answer(trace) -> str | None:
    """A reasoning trace's final answer, canonical as :func:`extract_answer` makes it;
    None when the trace found no answer (a bare number in its text does not count)."""
    return extract_answer(trace.text) if trace.answer is not None else None


def gsm8k_reference(solution: str) -> str:
    """The number after ``####`` in a GSM8K reference solution."""
    tail = solution.rsplit("####", 1)[-1]
    num = normalize_number(tail)
    if num is None:
        raise ValueError(f"GSM8K reference has no number after '####': {solution[-80:]!r}")
    return num
