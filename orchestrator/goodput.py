"""Goodput-aware speculation: draft steps only while drafting pays at the current load.

SmartSpec's idea at the step level. With one problem in flight, a drafted step
(draft writes, target verifies, repairs what it cuts) can beat the target
writing the step itself. With many problems in flight the target decodes them
in one batch, each token costs little, and the serial draft-verify-repair round
loses. Which regime holds depends on the machine, the models and the judge, so
the governor measures instead of guessing a count:

* *load*: traces of this reasoner in flight right now (``enter``/``exit``).
  Loads fall in buckets 1, 2-3, 4-7, 8-15, ... (powers of two).
* *rate*: per bucket and mode ("draft": a drafted, judged and maybe repaired
  step; "target": the target writes the step), an exponential moving average
  of seconds per token of the trace's text, observed on finished steps.
* *decision* before each step: alone (load 1) the draft always drafts (the
  latency case stepspec is for, and no batch to lose to). At a higher load,
  until a mode has been tried ``min_samples`` times in the current bucket
  (observed or still running) it is tried (exploration; drafting first); while
  those tries are running the target writes (the baseline, never a loss); then
  the mode with fewer seconds per token wins, and every ``explore_every``-th
  decision in the bucket goes to the other mode so its rate stays current.
  (Counting only finished tries, a wave of 25 problems that reach their first
  decision together would all draft before the first drafted step is measured.)

Worked example: alone, drafted steps cost 0.05 s/token and target steps 0.09:
draft. With 60 problems in flight (bucket 32-63), drafted steps cost 0.40
s/token and target steps 0.15 (batched decoding): the target writes, and the
trace records each such step with ``backoff=True``. When the load falls back,
that bucket's own rates decide again (and alone, the draft drafts).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class StepMode(str, enum.Enum):
    DRAFT = "draft"
    TARGET = "target"


@dataclass
class BucketRates:
    """Seconds per trace token of each mode at one load bucket."""

    seconds_per_token: dict[StepMode, float] = field(default_factory=dict)
    num_samples: dict[StepMode, int] = field(default_factory=lambda: {StepMode.DRAFT: 0, StepMode.TARGET: 0})
    num_running: dict[StepMode, int] = field(default_factory=lambda: {StepMode.DRAFT: 0, StepMode.TARGET: 0})
    num_decisions: int = 0


@dataclass
class GoodputGovernor:
    """Shared by every trace of a reasoner: the load, the measured rates, the decisions."""

    min_samples: int = 3
    explore_every: int = 20
    smoothing: float = 0.3  # weight of the newest observation
    in_flight: int = 0
    buckets: dict[int, BucketRates] = field(default_factory=dict)
    num_decisions: dict[StepMode, int] = field(default_factory=lambda: {StepMode.DRAFT: 0, StepMode.TARGET: 0})

    def enter(self) -> None:
        self.in_flight += 1

    def exit(self) -> None:
        self.in_flight -= 1

    @staticmethod
    def bucket(load: int) -> int:
        """The load bucket's lower bound: 1, 2, 4, 8, ..."""
        return 1 << (max(1, load).bit_length() - 1)

    def decide(self) -> StepMode:
        """Who writes the next step at the current load."""
        rates = self.buckets.setdefault(self.bucket(self.in_flight), BucketRates())
        rates.num_decisions += 1
        n, tried = rates.num_samples, {m: rates.num_samples[m] + rates.num_running[m] for m in StepMode}
        if self.in_flight <= 1 or tried[StepMode.DRAFT] < self.min_samples:
            mode = StepMode.DRAFT
        elif tried[StepMode.TARGET] < self.min_samples or min(n.values()) < self.min_samples:
            mode = StepMode.TARGET
        else:
            spt = rates.seconds_per_token
            best = StepMode.DRAFT if spt[StepMode.DRAFT] <= spt[StepMode.TARGET] else StepMode.TARGET
            other = StepMode.TARGET if best is StepMode.DRAFT else StepMode.DRAFT
            mode = other if rates.num_decisions % self.explore_every == 0 else best
        rates.num_running[mode] += 1
        self.num_decisions[mode] += 1
        return mode

    def observe(self, mode: StepMode, load: int, num_tokens: int, seconds: float) -> None:
        """A finished step: ``num_tokens`` of trace text in ``seconds``, begun at ``load``."""
        rates = self.buckets.setdefault(self.bucket(load), BucketRates())
        rates.num_running[mode] = max(0, rates.num_running[mode] - 1)
        if num_tokens < 1:
            return
        x = seconds / num_tokens
        old = rates.seconds_per_token.get(mode)
        rates.seconds_per_token[mode] = x if old is None else self.smoothing * x + (1 - self.smoothing) * old
        rates.num_samples[mode] += 1
