"""Value objects that cross the engine boundary.

Everything here is a frozen dataclass with no model library behind it, so the
orchestrator, judges and tests can build and read them without importing vLLM
or torch.

Terms (token level only; "step" belongs to the orchestrator):

* prompt tokens: the tokens of the request as sent to the model.
* cached prompt tokens: prompt tokens whose KV entries were found in the
  prefix cache, so they cost no prefill compute.
* output tokens: tokens the model generated for one completion.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence, Union

if TYPE_CHECKING:
    from stepspec.engine.stats import SpecDecodingStats

# A prompt is either text (tokenized by the engine) or a ready sequence of token ids.
Prompt = Union[str, Sequence[int]]


class FinishReason(str, enum.Enum):
    """Why a completion ended."""

    STOP = "stop"  # one of the request's stop strings was generated
    LENGTH = "length"  # max_tokens reached (or the context window ran out)
    EOS = "eos"  # the model emitted its end-of-sequence / stop token

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value

    @classmethod
    def from_vllm(cls, finish_reason: str | None, stop_reason: object) -> "tuple[FinishReason, str | None]":
        """(reason, stop string) from vLLM's pair: ``finish_reason`` "length" or "stop",
        and ``stop_reason`` the matched stop string (str) or the EOS/stop token (int, None).
        Anything else (an aborted request) is a ValueError."""
        if finish_reason == "length":
            return cls.LENGTH, None
        if finish_reason == "stop" and isinstance(stop_reason, str):
            return cls.STOP, stop_reason
        if finish_reason == "stop":
            return cls.EOS, None
        raise ValueError(f"request ended with finish_reason={finish_reason!r}")


@dataclass(frozen=True)
class Structured:
    """What a generation must follow, by construction (vLLM's structured outputs): exactly one
    of ``json`` (a JSON schema the whole text follows, as JSON text) and ``structural_tag``
    (free text until a trigger, then a part a schema binds, in vLLM's structural-tag JSON).

    Worked example: ``Structured(structural_tag='{"type": "structural_tag", "format": {"type":
    "triggered_tags", "triggers": ["<tool_call>"], "tags": [{"begin": "<tool_call>\\n", "content":
    {"type": "json_schema", "json_schema": {...}}, "end": "\\n</tool_call>"}]}}')``: the model
    writes freely; once it writes ``<tool_call>`` it can only go on with JSON that follows the
    schema (a call to ``add`` whose arguments follow its own), then the closing tag, and write
    freely again."""

    json: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        if (self.json is None) == (self.structural_tag is None):
            raise ValueError("a structured output is one of json or structural_tag")

    def params(self) -> dict[str, str]:
        """As vLLM's ``structured_outputs`` (a request's field, ``StructuredOutputsParams``' keywords)."""
        return {"json": self.json} if self.json is not None else {"structural_tag": self.structural_tag}


@dataclass(frozen=True)
class Sampling:
    """How to sample one request. Greedy when ``temperature == 0``."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    include_stop_str: bool = False
    # Number of top alternatives to return per generated token; None: no logprobs.
    # 0 returns only the sampled token's own logprob.
    logprobs: int | None = None
    # What the generated text must follow (a tool call's schema); None: free text.
    structured: Structured | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.stop, str):  # a lone string would be split into characters
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))


@dataclass(frozen=True)
class GenerationRequest:
    prompt: Prompt
    sampling: Sampling = field(default_factory=Sampling)

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):
            object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token with its log-probability and the top alternatives."""

    token_id: int
    token: str
    logprob: float
    # (token_id, token_text, logprob) of the most likely tokens at this position.
    top: tuple[tuple[int, str, float], ...] = ()


@dataclass(frozen=True)
class Completion:
    """One sampled continuation of a prompt."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    # The stop string that ended the completion, when finish_reason is STOP.
    stop_string: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    # Token-level speculation counters of this completion alone, when the engine
    # speculates and can attribute them (vLLM's per-request metrics).
    spec_decoding: "SpecDecodingStats | None" = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class GenerationResult:
    """All completions of one request (``n`` of them)."""

    completions: tuple[Completion, ...]
    num_prompt_tokens: int
    # None when the backend cannot tell (an OpenAI server that does not report it).
    num_cached_prompt_tokens: int | None = None

    @property
    def completion(self) -> Completion:
        """The first completion: the only one when n == 1."""
        return self.completions[0]

    @property
    def num_output_tokens(self) -> int:
        return sum(c.num_output_tokens for c in self.completions)


@dataclass(frozen=True)
class NextTokenDistribution:
    """Top-k of the next-token distribution after a prompt.

    What a judge needs when it reads a one-token answer (a 0-9 score, yes/no):
    one prefill, no decoding. ``top`` is sorted by decreasing logprob.
    """

    top: tuple[tuple[int, str, float], ...]
    num_prompt_tokens: int
    num_cached_prompt_tokens: int | None = None

    def logprob_of(self, token: str) -> float | None:
        """Logprob of the first top-k entry whose text, stripped, equals ``token``."""
        for _, text, lp in self.top:
            if text.strip() == token:
                return lp
        return None

    def by_text(self) -> dict[str, float]:
        """Stripped token text -> highest logprob among top-k entries with that text."""
        out: dict[str, float] = {}
        for _, text, lp in self.top:
            key = text.strip()
            if key not in out or lp > out[key]:
                out[key] = lp
        return out


@dataclass(frozen=True)
class ContinuationRequest:
    """A given continuation of a prefix, to be scored token by token (no generation).

    ``continuation`` is token ids (what a drafter generated: exact, no re-tokenization);
    ``top_k``: how many of the model's own most likely tokens to return per position.
    """

    prefix: Prompt
    continuation: tuple[int, ...]
    top_k: int = 5

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str):
            object.__setattr__(self, "prefix", tuple(int(t) for t in self.prefix))
        object.__setattr__(self, "continuation", tuple(int(t) for t in self.continuation))
        if not self.continuation:
            raise ValueError("a continuation to score needs at least one token")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")


@dataclass(frozen=True)
class ScoredToken:
    """One continuation token as the scoring model sees it at its position.

    ``rank`` is 1 when the token is the model's own top choice (greedy token);
    ``top`` holds the model's ``top_k`` most likely (token_id, logprob), best first,
    so the model's own token at a position is ``top[0][0]`` without another call.
    """

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class ContinuationScores:
    """Per-token scores of one continuation, in order (one prefill over prefix + continuation)."""

    tokens: tuple[ScoredToken, ...]
    num_prompt_tokens: int
    num_cached_prompt_tokens: int | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What an engine is, for result files and error messages."""

    name: str
    backend: str
    model: str
    max_model_len: int | None = None
    speculative_method: str | None = None
    dtype: str | None = None  # what the engine computes in (in-process engines, once started)
    dtype_reason: str | None = None  # why: stepspec.engine.dtype.DtypeChoice.reason
