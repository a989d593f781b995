"""The one protocol every model backend implements: batch in, batch out, async.

Callers hand over a whole batch so that a backend can schedule it at once
(vLLM batches the requests continuously; an HTTP backend sends them
concurrently). Several coroutines may call the same engine at the same time;
the backend batches across them too.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from stepspec.engine.stats import EngineStats
from stepspec.engine.types import ContinuationRequest, ContinuationScores, EngineInfo, GenerationRequest, GenerationResult, NextTokenDistribution, Prompt


class EngineError(RuntimeError):
    """A backend failed in a way the user can act on; the message says how."""


class EngineUnavailableError(EngineError):
    """The engine stopped answering altogether (its server is down or its process died):
    every later call fails the same way until it is restarted, so a caller running many
    independent calls stops starting new ones."""


@runtime_checkable
class Engine(Protocol):
    """A model that generates, scores next tokens, tokenizes and reports stats."""

    @property
    def info(self) -> EngineInfo: ...

    async def start(self) -> None:
        """Load the model or check the server; idempotent. Calls that need the model start it."""
        ...

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Continue every request's prompt; results in request order."""
        ...

    async def next_token_logprobs(
        self, prompts: Sequence[Prompt], top_k: int = 20
    ) -> list[NextTokenDistribution]:
        """Top-k logprobs of the single next token after each prompt (one prefill each)."""
        ...

    async def score_continuations(self, requests: Sequence[ContinuationRequest]) -> list[ContinuationScores]:
        """Each continuation token's logprob, rank and the model's top-k at its position,
        from one prefill of prefix + continuation that reads the prefix cache: what a
        verifier needs to judge drafted tokens. A prefix + continuation longer than the
        context window is an :class:`EngineError`."""
        ...

    def count_tokens(self, text: str) -> int:
        """Number of tokens ``text`` encodes to, without special tokens added."""
        ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The model's chat template rendered to prompt text.

        ``continue_final_message`` leaves the last (assistant) message open so that
        generation continues it: how a judge pre-fills ``Score:``. ``tools``: OpenAI
        function schemas, rendered as the template renders tools (Qwen2.5's: in the
        system turn, asking for ``<tool_call>`` tags); messages may then hold an
        assistant's ``tool_calls`` and ``tool`` results.
        """
        ...

    async def aapply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """:meth:`apply_chat_template` for code on the event loop: an engine that renders
        on a server (no tokenizer on this machine) awaits it instead of blocking."""
        ...

    async def acount_tokens(self, text: str) -> int:
        """:meth:`count_tokens` for code on the event loop (see :meth:`aapply_chat_template`)."""
        ...

    async def aencode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added (a collected step's text, to verify)."""
        ...

    async def adecode(self, token_ids: Sequence[int]) -> str:
        """The text of token ids (a token a verifier resampled, to write on from)."""
        ...

    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters since it started."""
        ...

    async def close(self) -> None:
        """Release the model (processes, memory, connections). Idempotent."""
        ...
