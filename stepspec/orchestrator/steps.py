"""Reasoning steps: where one ends, and where the final answer is.

A reasoning trace is a sequence of steps. A step ends at the step delimiter
(default a blank line, ``"\\n\\n"``), except inside a fenced code block, where a
blank line is part of the code. The final answer is the content of the last
``\\boxed{...}`` (nested braces allowed) or what follows "The answer is".

Models that think inside ``<think>...</think>`` (the template may open the tag
in the prompt): steps are the thinking; a ``\\boxed{}`` written while thinking
does not end the trace, the closing tag does, and the answer is read from the
text after it when that text has one.

Pure text functions: no engine, no model library.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from stepspec.engine.types import Structured

CODE_FENCE = "```"
DEFAULT_ANSWER_PATTERNS = (r"[Tt]he (?:final )?answer is:?\s*\$?(?P<answer>-?[\d,]*\.?\d+)",)


@dataclass(frozen=True)
class StepRules:
    """How text is cut into steps and where the answer is found."""

    delimiter: str = "\n\n"
    # Regexes tried after \boxed{}; each must have a named group "answer".
    answer_patterns: tuple[str, ...] = DEFAULT_ANSWER_PATTERNS
    think_start: str = "<think>"
    think_end: str = "</think>"
    # Agents: a step matching ``action_pattern`` (a tool call) ends the trace with
    # stop reason "action"; generation also stops where the model starts to write
    # the observation itself (``action_stop``), which the tool must give.
    action_pattern: str | None = None
    action_stop: str | None = None
    # Given the text of a drafted step that holds a call, why the call is invalid (an
    # undeclared tool, arguments against its schema), or None: such a step is rejected
    # whole before any judge sees it, and the target writes the step.
    action_check: Callable[[str], str | None] | None = field(default=None, compare=False)
    # Several calls a turn: a step holding a call does not end the trace, the model may write
    # more calls after it; the trace ends (stop reason "action") at the first later step that
    # holds none, or where the model ends its turn.
    several_calls: bool = False
    # What a step's text must follow where no call is open in it yet (the declared tools'
    # schemas once a call opens: vLLM's structured outputs); None: free text. A step that
    # continues an open call goes on without it (a structure binds from its opening).
    constraint: Structured | None = None

    def holds_call(self, text: str) -> bool:
        """Whether ``text`` holds (the beginning of) a tool call (``action_pattern``)."""
        return self.action_pattern is not None and re.search(self.action_pattern, text) is not None

    def __post_init__(self) -> None:
        if self.action_pattern is not None:
            try:
                re.compile(self.action_pattern)
            except re.error as e:
                raise ValueError(f"action pattern {self.action_pattern!r} is not a valid regex: {e}") from e
        if not self.delimiter:
            raise ValueError("the step delimiter must be a non-empty string, e.g. '\\n\\n'")
        if not self.think_start or not self.think_end:
            raise ValueError("the think tags must be non-empty strings, e.g. '<think>' and '</think>'")
        for p in self.answer_patterns:
            try:
                compiled = re.compile(p)
            except re.error as e:
                raise ValueError(f"answer pattern {p!r} is not a valid regex: {e}") from e
            if "answer" not in compiled.groupindex:
                raise ValueError(f"answer pattern {p!r} needs a named group (?P<answer>...)")


def constraint_after(rules: StepRules, text: str) -> Structured | None:
    """What a generation that continues ``text`` (the step written so far) must follow:
    ``rules.constraint``, unless ``text`` already holds a call's opening (a structure binds from
    its opening; a continuation inside it goes on free)."""
    return None if rules.holds_call(text) else rules.constraint


def inside_code_block(text: str) -> bool:
    """True when ``text`` ends inside an open ``` fenced code block."""
    return text.count(CODE_FENCE) % 2 == 1


def split_steps(text: str, delimiter: str = "\n\n") -> list[str]:
    """Cut ``text`` into steps at ``delimiter``, never inside a fenced code block.

    Steps keep their own text without the delimiter; empty pieces (several
    delimiters in a row) are dropped. ``"".join`` with the delimiter gives back
    the text up to such runs.
    """
    steps: list[str] = []
    current = ""
    for piece in text.split(delimiter):
        current = piece if not current else current + delimiter + piece
        if not inside_code_block(current):
            if current.strip():
                steps.append(current)
            current = ""
    if current.strip():
        steps.append(current)  # an unterminated code block ends the last step
    return steps


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, nested braces handled; None if none is closed."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        i = start + len("\\boxed{")
        depth = 1
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i:j].strip()
        start = text.rfind("\\boxed{", 0, start)  # unclosed: try an earlier one
    return None


def inside_thinking(text: str, rules: StepRules = StepRules()) -> bool:
    """True when ``text`` (prompt included) ends inside an open ``<think>`` block."""
    return text.rfind(rules.think_start) > text.rfind(rules.think_end)


def find_answer(text: str, rules: StepRules = StepRules()) -> str | None:
    """The final answer in ``text``: the last boxed value, else the last pattern match;
    after a closed ``</think>``, from the text after it when that has an answer."""
    if rules.think_end in text:
        after = _find_answer(text.rsplit(rules.think_end, 1)[1], rules)
        if after is not None:
            return after
    return _find_answer(text, rules)


def _find_answer(text: str, rules: StepRules) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    for pattern in rules.answer_patterns:
        matches = list(re.finditer(pattern, text))
        if matches:
            return matches[-1].group("answer").strip()
    return None


def answer_key(answer: str | None) -> str | None:
    """An answer normalized for voting: numbers compared as numbers ("18.0" == "18")."""
    if answer is None:
        return None
    text = answer.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = float(text)
    except ValueError:
        return " ".join(text.split())
    return str(int(value)) if value.is_integer() else repr(value)


def tally(texts: list[str], rules: StepRules = StepRules()) -> tuple[list[str | None], Counter[str]]:
    """Each text's answer as a vote (:func:`answer_key`; None: no answer), and the votes per answer."""
    answers = [answer_key(find_answer(text, rules)) for text in texts]
    return answers, Counter(a for a in answers if a is not None)
