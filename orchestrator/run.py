"""State shared by every strategy's loop: budgets, stop reasons, the growing trace."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping

from engine.protocol import Engine
from orchestrator.steps import StepRules, find_answer
from orchestrator.trace import StepRecord, Trace, join_steps


@dataclass(frozen=True)
class Budget:
    """Limits of one trace. ``max_tokens`` counts the tokens of the trace's text."""

    max_steps: int = 64
    max_tokens: int = 2048
    max_step_tokens: int = 256
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_tokens", "max_step_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"budget {name} must be >= 1, got {getattr(self, name)}")


class ReasoningError(RuntimeError):
    """A trace could not finish; ``trace`` holds every step written before the failure."""

    def __init__(self, message: str, trace: Trace) -> None:
        super().__init__(message)
        self.trace = trace


class TraceRun:
    """The trace being written, and why it should stop."""

    def __init__(self, question: str, strategy: str, rules: StepRules, budget: Budget,
                 engines: Mapping[str, Engine]) -> None:
        if not question or not question.strip():
            raise ValueError("the question is empty; give the problem text to reason about")
        self.question = question
        self.strategy = strategy
        self.rules = rules
        self.budget = budget
        self.engines = dict(engines)
        self.steps: list[StepRecord] = []
        self.ended: str | None = None  # "answer" or "eos" once a step ends the trace
        self._t0 = time.perf_counter()
        self._spec0 = {k: e.stats().spec_decoding for k, e in self.engines.items()}

    @property
    def step_texts(self) -> tuple[str, ...]:
        return tuple(s.text for s in self.steps)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.steps)

    def step_token_cap(self) -> int:
        """Tokens the next step may use: the per-step cap, within what is left."""
        return max(1, min(self.budget.max_step_tokens, self.budget.max_tokens - self.num_tokens))

    def add(self, record: StepRecord, ends_trace: bool) -> None:
        self.steps.append(record)
        if ends_trace:
            self.ended = "answer" if find_answer(record.text, self.rules) is not None else "eos"

    def stop_reason(self) -> str | None:
        """Why the trace should stop now, or None to write another step."""
        if self.ended:
            return self.ended
        if len(self.steps) >= 2 and self.steps[-1].complete and self.steps[-1].text.strip() == self.steps[-2].text.strip():
            return "repetition"
        if len(self.steps) >= self.budget.max_steps:
            return "max_steps"
        if self.num_tokens >= self.budget.max_tokens:
            return "max_tokens"
        if self.budget.max_seconds is not None and time.perf_counter() - self._t0 >= self.budget.max_seconds:
            return "timeout"
        return None

    def finish(self, stop_reason: str, error: str | None = None) -> Trace:
        steps = tuple(self.steps)
        return Trace(
            question=self.question,
            strategy=self.strategy,
            steps=steps,
            answer=find_answer(join_steps(steps, self.rules.delimiter), self.rules),
            stop_reason=stop_reason,
            seconds=time.perf_counter() - self._t0,
            spec_decoding={k: e.stats().spec_decoding.minus(self._spec0[k]).to_dict()
                           for k, e in self.engines.items()},
            error=error,
            delimiter=self.rules.delimiter,
        )
