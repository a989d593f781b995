"""Goodput-aware speculation: draft steps only while drafting pays at the current load.

SmartSpec's idea at the step level. With one problem in flight, a drafted step
(draft writes, target verifies, repairs what it cuts) can beat the target
writing the step itself. With many problems in flight the target decodes them
in one batch, each token costs little, and the serial draft-verify-repair round
may lose. Which regime holds depends on the machine, the models and the judge, so
the governor measures instead of guessing a count:

* *load*: traces of this reasoner in flight right now (``enter``/``exit``).
  Loads fall in buckets 1, 2-3, 4-7, 8-15, ... (powers of two).
* *rate*: per bucket and mode ("draft": a drafted, judged and maybe repaired
  step; "target": the target writes the step), an exponential moving average
  of seconds per token of the trace's text, observed on *pure* steps only: steps
  during which no step of the other mode ran (:meth:`begin` / :meth:`end`).
  The engines share the machine, so a target step that runs beside drafted steps
  is slowed by them (and the reverse); a rate taken from such a step would
  charge one mode for the other's cost and miss what drafting takes from the
  target's batch. At one load, a pure step's seconds per token of its trace is
  the load's trace tokens per second under that mode, up to the factor of load.
* *decision* before each step: alone (load 1) the draft always drafts (the
  latency case stepspec is for, and no batch to lose to). At a higher load, a
  *verdict* carried from a neighbouring load decides first: drafting that lost at
  a lower load loses here too (more in flight, cheaper target tokens), drafting
  that won at a higher load wins here too. Else the bucket's own rates: until a
  mode has ``min_samples`` pure steps, decisions go to it (exploration, the target
  first: a whole regime, since a mode's steps are pure only when every trace in
  flight writes in that mode), until ``max_spoiled`` of its steps have ended
  impure; a mode that could not be measured so (its steps never ran pure, as in
  a wave's tail) loses to the target, the baseline. Drafting's exploration costs
  drafted steps, so its steps in flight count against ``max_spoiled`` too: with
  25 in flight, 25 traces would begin a drafted step before the first one ends
  (the target's costs nothing against the baseline: only its ended steps count).
  Then the mode with fewer seconds per token wins, and every ``explore_every``-th
  decision in the bucket switches to the other mode until it has ``min_samples``
  more pure steps (again within ``max_spoiled``), so its rate stays current. The
  target's opening and plan (a policy's own choice, with the question's prefill)
  are no samples and belong to no regime: they run in either, as new problems arrive.

Worked example (GSM8K problems in waves of 25): the target writes every opening and plan; at
16-31 in flight all decisions go to the target until 4 target steps ran pure (say
0.2 s per trace token), then to the draft: 8 drafted steps begin (``max_spoiled``),
each beside target steps, so none is pure, and no more begin; drafting, unmeasured,
loses to the target, which writes on. With ``max_spoiled=50`` the whole wave would
draft until 4 drafted steps ran pure (say 0.4 s: every trace drafting), and the target
would win all the same, at the cost of about two drafted steps a trace. At 4-7 in
flight a regime forms within the bound and both rates are measured; once the target
wins there, it wins at 8 and beyond without asking (a verdict carried down is only a
win). Were any step a sample, a target step beside drafted ones would read slow and a
drafted one beside target steps fast, so drafting would look cheaper while it made
every wave slower. When the load falls back, that bucket's own rates decide again
(and alone, the draft drafts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from stepspec.orchestrator.trace import Author


@dataclass
class BucketRates:
    """Seconds per trace token of each mode at one load bucket, from pure steps."""

    seconds_per_token: dict[Author, float] = field(default_factory=dict)
    num_samples: dict[Author, int] = field(default_factory=lambda: {Author.DRAFT: 0, Author.TARGET: 0})
    num_decisions: int = 0
    # Steps of each mode that ended impure (no sample): exploration's cost, bounded by max_spoiled.
    num_spoiled: dict[Author, int] = field(default_factory=lambda: {Author.DRAFT: 0, Author.TARGET: 0})
    # Steps of each mode begun at this load as samples and not ended yet.
    num_running: dict[Author, int] = field(default_factory=lambda: {Author.DRAFT: 0, Author.TARGET: 0})
    # A re-measured mode: it writes until it has this many pure samples, or this many spoiled steps.
    exploring: Author | None = None
    explore_until: int = 0
    explore_spoiled_until: int = 0

    def spent(self, mode: Author) -> int:
        """What ``mode``'s exploration has spent without samples: its steps ended impure, and
        for the draft its steps in flight as well (each one a drafted step, measured or not)."""
        return self.num_spoiled[mode] + (self.num_running[mode] if mode is Author.DRAFT else 0)

    def verdict(self, min_samples: int) -> Author | None:
        """The faster mode, once both have their samples; None before."""
        if min(self.num_samples.values()) < min_samples:
            return None
        spt = self.seconds_per_token
        return Author.DRAFT if spt[Author.DRAFT] <= spt[Author.TARGET] else Author.TARGET


@dataclass(frozen=True)
class StepTicket:
    """A step in flight under a mode: what :meth:`GoodputGovernor.end` needs to measure it."""

    mode: Author | None  # None: a step the policy gives the target itself (no sample)
    load: int
    started: float
    pure: bool  # a sample, and no step of the other mode was running when it began
    others_started: int  # steps of the other mode begun before it (any later one makes it impure)


@dataclass
class GoodputGovernor:
    """Shared by every trace of a reasoner: the load, the measured rates, the decisions."""

    min_samples: int = 4
    max_spoiled: int = 8  # steps of a mode that may end impure while a bucket measures it
    explore_every: int = 250
    smoothing: float = 0.3  # weight of the newest observation
    clock: Callable[[], float] = time.perf_counter
    in_flight: int = 0
    buckets: dict[int, BucketRates] = field(default_factory=dict)
    num_decisions: dict[Author, int] = field(default_factory=lambda: {Author.DRAFT: 0, Author.TARGET: 0})
    # Steps running and begun, per kind: a mode, or None for the policy's own target steps.
    num_running: dict[Author | None, int] = field(default_factory=lambda: dict.fromkeys((*Author, None), 0))
    num_started: dict[Author | None, int] = field(default_factory=lambda: dict.fromkeys((*Author, None), 0))

    def enter(self) -> None:
        self.in_flight += 1

    def exit(self) -> None:
        self.in_flight -= 1

    @staticmethod
    def bucket(load: int) -> int:
        """The load bucket's lower bound: 1, 2, 4, 8, ..."""
        return 1 << (max(1, load).bit_length() - 1)

    def decide(self) -> Author:
        """Who writes the next step at the current load."""
        b = self.bucket(self.in_flight)
        rates = self.buckets.setdefault(b, BucketRates())
        rates.num_decisions += 1
        if self.in_flight <= 1:
            mode = Author.DRAFT
        else:
            mode = self.carried_verdict(b) or self.measure_or_choose(rates)
        self.num_decisions[mode] += 1
        return mode

    def carried_verdict(self, b: int) -> Author | None:
        """A neighbouring load's verdict that holds at bucket ``b``: the target, if it won at
        a lower load (beyond 1 in flight); the draft, if it won at a higher one. The nearest
        such load decides (measurements that disagree: the closer one holds, the lower on a tie)."""
        for other in sorted(self.buckets, key=lambda o: (abs(o.bit_length() - b.bit_length()), o > b)):
            verdict = self.buckets[other].verdict(self.min_samples)
            if (verdict is Author.TARGET and 1 < other < b) or (verdict is Author.DRAFT and other > b):
                return verdict
        return None

    def measure_or_choose(self, rates: BucketRates) -> Author:
        """The bucket's own decision: explore a mode that lacks samples (until it has spent
        max_spoiled steps, :meth:`BucketRates.spent`), else the faster mode, re-measuring the
        other one every ``explore_every`` decisions."""
        n = rates.num_samples
        for mode in (Author.TARGET, Author.DRAFT):
            if n[mode] < self.min_samples and rates.spent(mode) < self.max_spoiled:
                return mode
        ex = rates.exploring
        if ex is not None and n[ex] < rates.explore_until and rates.spent(ex) < rates.explore_spoiled_until:
            return ex
        rates.exploring = None
        # Unmeasured, its steps spoiled: the draft loses to the target, the baseline.
        best = rates.verdict(self.min_samples) or Author.TARGET
        if rates.num_decisions % self.explore_every == 0:
            rates.exploring = best.other
            rates.explore_until = n[best.other] + self.min_samples
            rates.explore_spoiled_until = rates.spent(best.other) + self.max_spoiled
            return best.other
        return best

    def begin(self, mode: Author, measured: bool = True) -> StepTicket:
        """A step starts under ``mode``. ``measured=False``: a step the policy gives the
        target itself (the opening and the plan, with the question's prefill): no sample,
        and no regime's: it runs in either, so it leaves the steps beside it pure."""
        kind = mode if measured else None
        ticket = StepTicket(kind, self.in_flight, self.clock(), measured and not self.num_running[mode.other],
                            self.num_started[mode.other])
        self.num_running[kind] += 1
        self.num_started[kind] += 1
        if kind is not None:
            self.buckets.setdefault(self.bucket(ticket.load), BucketRates()).num_running[kind] += 1
        return ticket

    def end(self, ticket: StepTicket, num_tokens: int) -> None:
        """The step of ``ticket`` wrote ``num_tokens`` of trace text; measured if it stayed pure."""
        kind = ticket.mode
        self.num_running[kind] -= 1
        if kind is None:
            return
        rates = self.buckets[self.bucket(ticket.load)]  # begin made it
        rates.num_running[kind] -= 1
        if ticket.pure and self.num_started[kind.other] == ticket.others_started:
            self.observe(kind, ticket.load, num_tokens, self.clock() - ticket.started)
        else:
            rates.num_spoiled[kind] += 1

    def snapshot(self) -> dict:
        """What it measured and decided, for a results file: per load bucket, each mode's
        seconds per trace token, pure samples and spoiled steps; decisions per mode. ``restore``
        reads it back."""
        return {"decisions": {m.value: n for m, n in self.num_decisions.items()},
                "buckets": {str(b): {m.value: {"seconds_per_token": r.seconds_per_token.get(m),
                                               "samples": r.num_samples[m], "spoiled": r.num_spoiled[m]}
                                     for m in Author} | {"decisions": r.num_decisions}
                            for b, r in sorted(self.buckets.items())}}

    @classmethod
    def restore(cls, snapshot: dict, **settings: object) -> "GoodputGovernor":
        """A governor that knows what ``snapshot`` measured (a later session of a bench, as a
        server keeps its governor); nothing in flight."""
        governor = cls(**settings)  # type: ignore[arg-type]
        governor.num_decisions.update({Author(m): n for m, n in snapshot["decisions"].items()})
        for b, modes in snapshot["buckets"].items():
            rates = governor.buckets[int(b)] = BucketRates(num_decisions=modes.get("decisions", 0))
            for m in Author:
                if modes[m.value]["seconds_per_token"] is not None:
                    rates.seconds_per_token[m] = modes[m.value]["seconds_per_token"]
                rates.num_samples[m] = modes[m.value]["samples"]
                rates.num_spoiled[m] = modes[m.value].get("spoiled", 0)
        return governor

    def observe(self, mode: Author, load: int, num_tokens: int, seconds: float) -> None:
        """A pure step: ``num_tokens`` of trace text in ``seconds``, begun at ``load``."""
        if num_tokens < 1:
            return
        rates = self.buckets.setdefault(self.bucket(load), BucketRates())
        x = seconds / num_tokens
        old = rates.seconds_per_token.get(mode)
        rates.seconds_per_token[mode] = x if old is None else self.smoothing * x + (1 - self.smoothing) * old
        rates.num_samples[mode] += 1
