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
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from stepspec.engine.types import Structured

CODE_FENCE = "```"
DEFAULT_ANSWER_PATTERNS = (r"[Tt]he (?:final )?answer is:?\s*\$?(?P<answer>-?[\d,]*\.?\d+)",)


@runtime_checkable
class CallRule(Protocol):
    """How a trace's tool calls are found, ended and checked: the rule an agent or a served request
    with tools gives its steps (:class:`StepRules.calls`). Implemented by
    :class:`stepspec.workflows.agents.toolcalls.ToolCalling` (declared tools, read by a vLLM tool
    parser) and :class:`TextCalls` (an agent's text actions).

    ``start``: the regex where a call begins in a step's text; a step matching it holds a call, and
    the trace ends there (stop reason "action") for the call to run. ``stop``: where the call's
    result would begin if the model went on to write it: generation stops there. ``several``: a
    turn may write several calls, a step each; the trace ends at the first later step that holds
    none, or where the model stops to read a result. ``constraint``: what a step's text must follow
    where no call is open in it yet (the declared tools' schemas once a call opens: vLLM's
    structured outputs); None: free text. :meth:`problem`: why the call(s) a step's text holds are
    invalid (an undeclared tool, arguments against its schema), or None; a drafted step holding an
    invalid call is rejected whole before any judge sees it, and the target writes the step.
    :meth:`forced_spans`: the spans of a step's text that the constraint wrote itself, where the model had
    no choice (a bound call's ``{"name": "add", "arguments": `` with one tool declared); a
    token-level verifier does not test the tokens inside them, since the target, bound, would
    have written them too. :meth:`repeated`: whether a turn's text writes a call it already wrote
    (the same tool, the same arguments): a model in a loop; the turn ends there, its calls up to
    the repeat.

    Worked example: ``TextCalls(start=r"Action:", stop="Observation:")``: the step "Action:
    search(\"tea\")" ends the trace; a model going on to write "Observation:" is stopped there."""

    start: str
    stop: str
    several: bool
    constraint: Structured | None

    def problem(self, text: str) -> str | None: ...

    def forced_spans(self, text: str) -> tuple[tuple[int, int], ...]: ...

    def repeated(self, text: str) -> bool: ...


def opens_call(rule: CallRule, text: str) -> bool:
    """Whether ``text`` holds (the beginning of) a call by ``rule`` (its ``start`` found in it)."""
    return re.search(rule.start, text) is not None


@dataclass(frozen=True)
class TextCalls:
    """A :class:`CallRule` for calls written as text (an agent's ``Action: tool(...)`` lines):
    found by ``start``, never invalid here (the agent reads each call when it runs it)."""

    start: str
    stop: str
    several: bool = False
    constraint: Structured | None = None

    def problem(self, text: str) -> str | None:
        return None

    def forced_spans(self, text: str) -> tuple[tuple[int, int], ...]:
        return ()

    def repeated(self, text: str) -> bool:
        return False  # one call a turn: the trace ends at it


@dataclass(frozen=True)
class StepRules:
    """How text is cut into steps and where the answer is found; ``calls``: how the trace's tool
    calls are found and checked (:class:`CallRule`; None: no tools)."""

    delimiter: str = "\n\n"
    # Regexes tried after \boxed{}; each must have a named group "answer".
    answer_patterns: tuple[str, ...] = DEFAULT_ANSWER_PATTERNS
    think_start: str = "<think>"
    think_end: str = "</think>"
    calls: CallRule | None = None

    def holds_call(self, text: str) -> bool:
        """Whether ``text`` holds (the beginning of) a tool call (``calls.start``)."""
        return self.calls is not None and opens_call(self.calls, text)

    def forced_spans(self, text: str) -> tuple[tuple[int, int], ...]:
        """The spans of ``text`` a call's constraint wrote itself (:meth:`CallRule.forced_spans`)."""
        return self.calls.forced_spans(text) if self.calls is not None else ()

    @property
    def stops(self) -> tuple[str, ...]:
        """Where every step's generation stops: the delimiter, the end of the thinking, and where a
        call's result would begin."""
        result = (self.calls.stop,) if self.calls is not None and self.calls.stop else ()
        return (self.delimiter, self.think_end) + result

    def __post_init__(self) -> None:
        if self.calls is not None:
            if not isinstance(self.calls, CallRule):
                raise ValueError(f"calls={self.calls!r} is not a call rule: it needs start, stop, several, constraint "
                                 "and problem(text), forced_spans(text) and repeated(text) methods "
                                 "(stepspec.orchestrator.steps.CallRule)")
            try:
                re.compile(self.calls.start)
            except re.error as e:
                raise ValueError(f"call start {self.calls.start!r} is not a valid regex: {e}") from e
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
    ``rules.calls.constraint``, unless ``text`` already holds a call's opening (a structure binds
    from its opening; a continuation inside it goes on free)."""
    return None if rules.calls is None or rules.holds_call(text) else rules.calls.constraint


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
