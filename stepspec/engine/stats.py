"""Token-level counters an engine reports. No logging here: callers read them.

Token-level speculative decoding, as vLLM counts it. Each *draft* is one
proposal of up to ``k`` tokens made by the proposer (a draft model, n-gram or
suffix lookup, an EAGLE head) for one sequence at one decoding step. The target
model verifies all of them in one forward pass:

* draft tokens: tokens proposed (at most ``k`` per draft).
* accepted tokens: the longest prefix of a draft that the target agrees with.
* the target also always contributes one token of its own per verification
  step: the *recovered* token at the first mismatch, or the *bonus* token after
  a fully accepted draft. vLLM does not count it among accepted tokens.

Worked example, k = 3, two drafts::

    draft 1 proposes  "the cat sat",  target agrees with "the cat", rejects "sat"
        -> 3 draft tokens, 2 accepted (positions 0 and 1), 1 recovered token
    draft 2 proposes  "on the mat",   target agrees with all three
        -> 3 draft tokens, 3 accepted (positions 0, 1, 2), 1 bonus token

    num_drafts = 2, num_draft_tokens = 6, num_accepted_tokens = 5
    num_accepted_tokens_per_pos = [2, 2, 1]
    acceptance_rate = 5 / 6 = 0.83
    mean_acceptance_length = 1 + 5 / 2 = 3.5  tokens emitted per target pass
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodingStats:
    """Running token-level acceptance counters of one engine."""

    num_spec_tokens: int = 0  # k, the configured proposal length (0: no speculation)
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def from_histogram(
        cls, num_spec_tokens: int, histogram: list[int], num_draft_tokens: int
    ) -> "SpecDecodingStats":
        """From vLLM's per-request acceptance histogram.

        ``histogram[j]`` counts verification steps that accepted exactly j draft
        tokens, so position i was accepted in every step that accepted more than i:
        with k = 3 and histogram [1, 0, 2, 5], per position [7, 7, 5], 7 + 7 + 5 =
        19 accepted tokens in 8 drafts.
        """
        hist = [int(c) for c in histogram]
        return cls(
            num_spec_tokens=num_spec_tokens,
            num_drafts=sum(hist),
            num_draft_tokens=num_draft_tokens,
            num_accepted_tokens=sum(j * c for j, c in enumerate(hist)),
            num_accepted_tokens_per_pos=[sum(hist[i + 1 :]) for i in range(num_spec_tokens)],
        )

    def observe_draft(
        self, num_draft_tokens: int, num_accepted_tokens_per_pos: list[int], num_drafts: int = 1
    ) -> None:
        """Add ``num_drafts`` drafts proposing ``num_draft_tokens`` tokens in all.

        ``num_accepted_tokens_per_pos[i]`` is how many of them had position i accepted.
        """
        self.num_drafts += num_drafts
        self.num_draft_tokens += num_draft_tokens
        if len(self.num_accepted_tokens_per_pos) < len(num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos.extend(
                [0] * (len(num_accepted_tokens_per_pos) - len(self.num_accepted_tokens_per_pos))
            )
        for i, n in enumerate(num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[i] += n
        self.num_accepted_tokens += sum(num_accepted_tokens_per_pos)

    def observe(self, other: "SpecDecodingStats") -> None:
        """Fold another snapshot's counts into this one."""
        self.num_spec_tokens = max(self.num_spec_tokens, other.num_spec_tokens)
        self.observe_draft(
            other.num_draft_tokens, list(other.num_accepted_tokens_per_pos), other.num_drafts
        )

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens; None before any draft."""
        if self.num_draft_tokens == 0:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens emitted per target verification pass: 1 + accepted / drafts."""
        if self.num_drafts == 0:
            return None
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        if self.num_drafts == 0:
            return []
        return [n / self.num_drafts for n in self.num_accepted_tokens_per_pos]

    def minus(self, earlier: "SpecDecodingStats") -> "SpecDecodingStats":
        """The counts added since ``earlier`` (a snapshot of this same engine)."""
        per_pos = [
            n - (earlier.num_accepted_tokens_per_pos[i] if i < len(earlier.num_accepted_tokens_per_pos) else 0)
            for i, n in enumerate(self.num_accepted_tokens_per_pos)
        ]
        return SpecDecodingStats(
            num_spec_tokens=self.num_spec_tokens,
            num_drafts=self.num_drafts - earlier.num_drafts,
            num_draft_tokens=self.num_draft_tokens - earlier.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens - earlier.num_accepted_tokens,
            num_accepted_tokens_per_pos=per_pos,
        )

    def copy(self) -> "SpecDecodingStats":
        return SpecDecodingStats(
            self.num_spec_tokens,
            self.num_drafts,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            list(self.num_accepted_tokens_per_pos),
        )

    def to_dict(self) -> dict:
        return {
            "num_spec_tokens": self.num_spec_tokens,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
        }


@dataclass
class EngineStats:
    """Request-level counters of one engine since it started."""

    num_requests: int = 0  # generation requests plus next-token scoring requests
    num_prompt_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    num_output_tokens: int = 0
    generate_seconds: float = 0.0  # wall time spent inside generate / next-token calls
    spec_decoding: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    peak_rss_bytes: int | None = None  # peak resident memory of the engine's processes
    rss_bytes: int | None = None  # their resident memory now (None once closed)

    def observe_call(
        self,
        num_requests: int,
        num_prompt_tokens: int,
        num_cached_prompt_tokens: int,
        num_output_tokens: int,
        seconds: float,
    ) -> None:
        self.num_requests += num_requests
        self.num_prompt_tokens += num_prompt_tokens
        self.num_cached_prompt_tokens += num_cached_prompt_tokens
        self.num_output_tokens += num_output_tokens
        self.generate_seconds += seconds

    def observe_generation(self, results, seconds: float) -> None:
        """Count one ``generate`` call: a list of :class:`stepspec.engine.types.GenerationResult`."""
        self.observe_call(
            num_requests=len(results),
            num_prompt_tokens=sum(r.num_prompt_tokens for r in results),
            num_cached_prompt_tokens=sum(r.num_cached_prompt_tokens or 0 for r in results),
            num_output_tokens=sum(r.num_output_tokens for r in results),
            seconds=seconds,
        )

    def observe_next_token(self, dists, seconds: float) -> None:
        """Count one ``next_token_logprobs`` call: one output token per prompt."""
        self.observe_call(
            num_requests=len(dists),
            num_prompt_tokens=sum(d.num_prompt_tokens for d in dists),
            num_cached_prompt_tokens=sum(d.num_cached_prompt_tokens or 0 for d in dists),
            num_output_tokens=len(dists),
            seconds=seconds,
        )

    def snapshot(self, peak_rss_bytes: int | None = None, rss_bytes: int | None = None) -> "EngineStats":
        """An independent copy, with the memory readings set when given."""
        return EngineStats(
            num_requests=self.num_requests,
            num_prompt_tokens=self.num_prompt_tokens,
            num_cached_prompt_tokens=self.num_cached_prompt_tokens,
            num_output_tokens=self.num_output_tokens,
            generate_seconds=self.generate_seconds,
            spec_decoding=self.spec_decoding.copy(),
            peak_rss_bytes=peak_rss_bytes if peak_rss_bytes is not None else self.peak_rss_bytes,
            rss_bytes=rss_bytes,
        )

    @property
    def output_tokens_per_second(self) -> float | None:
        if self.generate_seconds <= 0:
            return None
        return self.num_output_tokens / self.generate_seconds

    def to_dict(self) -> dict:
        return {
            "num_requests": self.num_requests,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_cached_prompt_tokens": self.num_cached_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "generate_seconds": self.generate_seconds,
            "output_tokens_per_second": self.output_tokens_per_second,
            "peak_rss_bytes": self.peak_rss_bytes,
            "rss_bytes": self.rss_bytes,
            "spec_decoding": self.spec_decoding.to_dict(),
        }
