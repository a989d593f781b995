"""Grading a response against a dataset's reference answer.

Each grader returns one :class:`Grade` per metric it reports; the first metric
is the primary one (tables and speedups use it):

* ``gsm8k``: ``strict`` — the number in an explicit final-answer form, the last
  of ``\\boxed{N}``, ``#### N`` or ``The answer is N`` (lm-evaluation-harness's
  strict match, plus the boxed form our prompt asks for); ``flexible`` — the
  last number anywhere (the harness's flexible-extract regex).
* ``aime``: an integer 0-999 from the last ``\\boxed{}`` (nested braces).
* ``math``: mathematical equivalence of the last ``\\boxed{}`` with the
  reference LaTeX, by ``math-verify`` (fractions, intervals, tuples, units).
* ``numeric``: for user JSONL files: the last boxed value, else the last number,
  equal as numbers (or, when the reference is not a number, as text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from stepspec.judges.exact import numbers_in
from stepspec.orchestrator.steps import last_boxed


@dataclass(frozen=True)
class Grade:
    extracted: str | None  # the answer found in the response (canonical), None if none
    correct: bool


class Grader(Protocol):
    name: str
    metrics: tuple[str, ...]  # the first is the primary metric

    def gold(self, reference: str) -> str:
        """The canonical reference answer (GSM8K: the number after ``####``)."""
        ...

    def grade(self, response: str, reference: str) -> dict[str, Grade]:
        ...


def normalize_number(s: str) -> str | None:
    """The last number in ``s``, canonical (no $ or thousands separators, no trailing
    decimal zeros); None if there is none."""
    numbers = numbers_in(s.replace("$", "").replace("\\!", ""))
    return numbers[-1] if numbers else None


def extract_answer(response: str) -> str | None:
    """The final numeric answer: the last boxed value, else the last number."""
    boxed = last_boxed(response)
    if boxed is not None:
        return normalize_number(boxed) or boxed
    return normalize_number(response)


# lm-evaluation-harness gsm8k: strict "#### N" / "The answer is N"; flexible-extract's regex.
_STRICT = re.compile(r"####\s*(\$?-?[0-9.,]+)|[Tt]he (?:final )?answer is[:\s]*\$?\s*(-?[$0-9.,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


class GSM8KGrader:
    name = "gsm8k"
    metrics = ("strict", "flexible")

    def gold(self, reference: str) -> str:
        num = normalize_number(reference.rsplit("####", 1)[-1])
        if num is None:
            raise ValueError(f"GSM8K reference has no number after '####': {reference[-80:]!r}")
        return num

    def strict(self, response: str) -> str | None:
        found: list[tuple[int, str | None]] = [(m.start(), normalize_number(m.group(1) or m.group(2)))
                                               for m in _STRICT.finditer(response)]
        start = response.rfind("\\boxed{")
        boxed = last_boxed(response)
        if boxed is not None:
            found.append((start, normalize_number(boxed)))
        return max(found)[1] if found else None

    def flexible(self, response: str) -> str | None:
        matches = [a or b for a, b in _FLEXIBLE.findall(response)]
        for m in reversed(matches):
            if (num := normalize_number(m)) is not None:
                return num
        return None

    def grade(self, response: str, reference: str) -> dict[str, Grade]:
        gold = self.gold(reference)
        strict, flexible = self.strict(response), self.flexible(response)
        return {"strict": Grade(strict, strict == gold), "flexible": Grade(flexible, flexible == gold)}


_AIME_INT = re.compile(r"^0*(\d{1,3})$")


class AIMEGrader:
    name = "aime"
    metrics = ("exact",)

    def gold(self, reference: str) -> str:
        m = _AIME_INT.match(reference.strip())
        if m is None:
            raise ValueError(f"AIME reference is not an integer 0-999: {reference!r}")
        return str(int(m.group(1)))

    def extract(self, response: str) -> str | None:
        boxed = last_boxed(response)
        if boxed is None:
            return None
        text = re.sub(r"\\text\{([^}]*)\}|\\[,!; ]|\$|\^\{?\\circ\}?", r"\1", boxed).strip().rstrip(".")
        m = _AIME_INT.match(text.replace(",", ""))
        return str(int(m.group(1))) if m else None

    def grade(self, response: str, reference: str) -> dict[str, Grade]:
        extracted = self.extract(response)
        return {"exact": Grade(extracted, extracted == self.gold(reference))}


class MathGrader:
    """MATH-500: ``math-verify`` parses the reference and the response's last boxed
    answer into sympy and checks equivalence."""

    name = "math"
    metrics = ("math_verify",)

    def gold(self, reference: str) -> str:
        return reference.strip()

    def grade(self, response: str, reference: str) -> dict[str, Grade]:
        from math_verify import LatexExtractionConfig, parse, verify

        boxed = last_boxed(response)
        if boxed is None:
            return {"math_verify": Grade(None, False)}
        gold = parse(f"${reference.strip()}$", extraction_config=[LatexExtractionConfig()])
        pred = parse(f"$\\boxed{{{boxed}}}$", extraction_config=[LatexExtractionConfig()])
        if not gold:
            raise ValueError(f"math-verify cannot parse the reference answer {reference!r}")
        correct = bool(pred) and verify(gold, pred)
        return {"math_verify": Grade(str(pred[-1]) if pred else boxed, correct)}


class NumericGrader:
    name = "numeric"
    metrics = ("exact",)

    def gold(self, reference: str) -> str:
        return normalize_number(reference) if re.fullmatch(r"\s*\$?-?[0-9.,]+\s*", reference) else reference.strip()

    def grade(self, response: str, reference: str) -> dict[str, Grade]:
        gold = self.gold(reference)
        boxed = last_boxed(response)
        if normalize_number(gold) == gold:
            extracted = extract_answer(response)
        else:
            extracted = boxed.strip() if boxed is not None else None
        return {"exact": Grade(extracted, extracted == gold)}


GRADERS: dict[str, type] = {"gsm8k": GSM8KGrader, "aime": AIMEGrader, "math": MathGrader, "numeric": NumericGrader}


def get_grader(name: str) -> Grader:
    if name not in GRADERS:
        raise ValueError(f"unknown grader '{name}'; choose one of: {', '.join(GRADERS)}")
    return GRADERS[name]()
