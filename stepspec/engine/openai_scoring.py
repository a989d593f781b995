"""Continuation scoring for :class:`stepspec.engine.openai_backend.OpenAIEngine`: each continuation
token's logprob, rank and the model's top-k, read from a server's ``prompt_logprobs``
(vLLM) or its echoed prompt logprobs (the backend's module docstring says how).
:class:`ContinuationScoring` holds the engine's methods for it."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from stepspec.engine.openai_http import TOKEN_ID_PREFIX, ServerHTTPError, gather_or_cancel
from stepspec.engine.protocol import EngineError
from stepspec.engine.types import ContinuationRequest, ContinuationScores, Prompt, ScoredToken

logger = logging.getLogger("stepspec.engine.openai_backend")

# How score_continuations reads a server's logprobs (see the module docstring).
PROMPT_LOGPROBS = "prompt_logprobs"
ECHO = "echo"


class PromptLogprobsIgnored(EngineError):
    """A 2xx answer without ``prompt_logprobs``: the server ignored the field."""


class ContinuationScoring:
    """:meth:`score_continuations` of :class:`stepspec.engine.openai_backend.OpenAIEngine` (which
    provides ``_complete``, ``_usage``, ``_top_ids``, ``_key_to_id``, ``aencode``, ``start``
    and the ``_scoring_mode`` it found)."""

    # -- continuation scoring ------------------------------------------------------

    async def score_continuations(self, requests: Sequence[ContinuationRequest]) -> list[ContinuationScores]:
        """Each continuation token's logprob, rank and the model's top-k at its position.

        One greedy one-token completion per request, prompt = prefix + continuation as
        token ids (a text prefix is tokenized as :meth:`encode` does), all sent
        concurrently, read as the module docstring says. The token at prompt index ``t``
        is scored by the model's distribution after the first ``t`` prompt tokens; its
        rank is 1 + the number of tokens the model finds strictly more likely (1: the
        model's own greedy token). A cached position's logprobs are not computed: the
        token at index ``t`` is valid only when ``t - 1 >= cached``, else the request is
        sent once more with a fresh ``cache_salt``. ``num_cached_prompt_tokens`` is the
        server's report (``usage.prompt_tokens_details.cached_tokens``), None when it
        sends none. Prefix + continuation of ``max_model_len`` tokens or more (one more
        token is generated) is an :class:`EngineError` before anything is sent.
        """
        await self.start()
        prefixes = await gather_or_cancel([self._prefix_ids(r.prefix) for r in requests])
        prompts = [prefix + list(r.continuation) for prefix, r in zip(prefixes, requests)]
        for prefix, ids in zip(prefixes, prompts):
            if self.max_model_len is not None and len(ids) >= self.max_model_len:
                raise EngineError(f"engine '{self.name}': prefix + continuation is {len(ids)} tokens ({len(prefix)} + "
                                  f"{len(ids) - len(prefix)}) but max_model_len is {self.max_model_len}; score a "
                                  "shorter continuation or prefix, or serve the model with a larger --max-model-len")
        work = [(ids, len(prefix), r) for ids, prefix, r in zip(prompts, prefixes, requests)]
        t0 = time.perf_counter()
        results: list[ContinuationScores] = []
        if work and self._scoring_mode is None:
            results.append(await self._probe_scoring(*work[0]))
            work = work[1:]
        mode = self._scoring_mode
        results += await gather_or_cancel([self._score_one(mode, *w) for w in work])
        self._stats.observe_call(
            num_requests=len(results),
            num_prompt_tokens=sum(r.num_prompt_tokens for r in results),
            num_cached_prompt_tokens=sum(r.num_cached_prompt_tokens or 0 for r in results),
            num_output_tokens=len(results),  # the one greedy token each request generates
            seconds=time.perf_counter() - t0,
        )
        return results

    async def _prefix_ids(self, prefix: Prompt) -> list[int]:
        ids = (await self.aencode(prefix) if prefix else []) if isinstance(prefix, str) else list(prefix)
        if not ids:
            raise EngineError(f"engine '{self.name}': empty prefix; a continuation is scored after at least one "
                              "prefix token (start the prefix with the prompt it continues)")
        return [int(t) for t in ids]

    async def _probe_scoring(self, ids: list[int], num_prefix: int, request: ContinuationRequest) -> ContinuationScores:
        """Score one request with ``prompt_logprobs``, else with ``echo``, and keep the
        mode that worked for this engine; an EngineError naming both failures if neither."""
        try:
            result = await self._score_one(PROMPT_LOGPROBS, ids, num_prefix, request)
        except PromptLogprobsIgnored as e:
            why = str(e)
        except ServerHTTPError as e:
            if e.status not in (400, 422) or PROMPT_LOGPROBS not in e.server_message:
                raise
            why = f"the server refused prompt_logprobs: HTTP {e.status}: {e.server_message}"
        else:
            self._use_scoring_mode(PROMPT_LOGPROBS, "the server returns prompt_logprobs")
            return result
        try:
            result = await self._score_one(ECHO, ids, num_prefix, request)
        except EngineError as e:
            raise EngineError(f"engine '{self.name}': the server at {self.base_url} cannot score continuations: not "
                              f"with prompt_logprobs ({why}), nor with echo + logprobs ({e}). Serve the model with "
                              "vLLM, or with a server whose /v1/completions returns the prompt's logprobs for "
                              "echo=true.") from e
        self._use_scoring_mode(ECHO, why)
        return result

    def _use_scoring_mode(self, mode: str, why: str) -> None:
        if self._scoring_mode != mode:
            logger.info("engine '%s': scoring continuations with %s (%s)", self.name, mode, why)
        self._scoring_mode = mode

    def _scoring_payload(self, mode: str, ids: list[int], top_k: int) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        if mode == PROMPT_LOGPROBS:
            payload["prompt_logprobs"] = top_k
        else:
            # Keys of top_logprobs as "token_id:N" (vLLM); other servers key by text.
            payload.update(echo=True, logprobs=top_k, return_tokens_as_token_ids=True)
        return payload

    @staticmethod
    def _reads_cached_continuation(cached: int | None, num_prefix: int) -> bool:
        """True when the cache served the position that scores the first continuation
        token (prompt index ``num_prefix`` is valid when ``num_prefix - 1 >= cached``)."""
        return cached is not None and cached > num_prefix - 1

    async def _score_one(self, mode: str, ids: list[int], num_prefix: int,
                         request: ContinuationRequest) -> ContinuationScores:
        payload = self._scoring_payload(mode, ids, request.top_k)
        body = await self._complete(payload)
        _, cached = self._usage(body)
        if self._reads_cached_continuation(cached, num_prefix):
            logger.info(
                "engine '%s': the server read %d of %d prompt tokens from its prefix cache, past "
                "the %d-token prefix; scoring again with a fresh cache_salt",
                self.name, cached, len(ids), num_prefix,
            )  # fmt: skip
            body = await self._complete({**payload, "cache_salt": uuid.uuid4().hex})
            _, cached = self._usage(body)
            if self._reads_cached_continuation(cached, num_prefix):
                raise EngineError(f"engine '{self.name}': the server read {cached} of {len(ids)} prompt tokens from its "
                                  f"prefix cache, past the {num_prefix}-token prefix, even with a fresh cache_salt, so "
                                  "it computed no logprobs for the continuation; start the server without prefix "
                                  "caching (vLLM: --no-enable-prefix-caching)")
        read = self._prompt_logprob_tokens if mode == PROMPT_LOGPROBS else self._echo_tokens
        tokens = read(body["choices"][0], ids, num_prefix, request)
        return ContinuationScores(tokens, num_prompt_tokens=len(ids), num_cached_prompt_tokens=cached)

    def _prompt_logprob_tokens(self, choice: Mapping[str, Any], ids: list[int], num_prefix: int,
                               request: ContinuationRequest) -> tuple[ScoredToken, ...]:
        """The continuation's tokens from vLLM's ``prompt_logprobs``: one entry per prompt
        position (None at index 0), each ``{"<token id>": {"logprob", "rank", ...}}``
        holding the prompt token and the model's top ``prompt_logprobs`` tokens."""
        positions = choice.get(PROMPT_LOGPROBS)
        if positions is None:
            raise PromptLogprobsIgnored(f"engine '{self.name}': the server answered a prompt_logprobs request "
                                         "without prompt_logprobs, so it does not support them (vLLM does)")
        if len(positions) != len(ids):
            raise EngineError(f"engine '{self.name}': the server returned {len(positions)} prompt-logprob "
                              f"positions for a prompt of {len(ids)} tokens")
        tokens = []
        for t, tok in enumerate(request.continuation, start=num_prefix):
            position = positions[t] or {}
            chosen = position.get(str(tok))
            if chosen is None or chosen.get("rank") is None:
                raise EngineError(f"engine '{self.name}': the server's prompt_logprobs at prompt index {t} hold no "
                                  f"logprob and rank for the prompt's token {tok}")
            top = sorted(((int(k), float(v["logprob"]), int(v["rank"])) for k, v in position.items()
                          if v.get("rank") is not None and v["rank"] <= request.top_k), key=lambda e: e[2])
            tokens.append(ScoredToken(tok, float(chosen["logprob"]), int(chosen["rank"]),
                                      tuple((tid, lp) for tid, lp, _ in top)))
        return tuple(tokens)

    def _echo_tokens(self, choice: Mapping[str, Any], ids: list[int], num_prefix: int,
                     request: ContinuationRequest) -> tuple[ScoredToken, ...]:
        """The continuation's tokens from an echoed prompt's ``logprobs``: per position
        the token's ``token_logprobs`` entry and a ``top_logprobs`` dict (None at index 0)."""
        lp = choice.get("logprobs")
        if not lp:
            raise EngineError(f"engine '{self.name}': the server answered an echo + logprobs request without "
                              "logprobs")
        token_lps, tops, texts = lp.get("token_logprobs") or [], lp.get("top_logprobs") or [], lp.get("tokens") or []
        if len(token_lps) < len(ids) or len(tops) < len(ids):
            raise EngineError(f"engine '{self.name}': the server echoed {len(token_lps)} logprobs for a prompt of "
                              f"{len(ids)} tokens, so it does not echo the prompt's logprobs")
        tokens = []
        for t, tok in enumerate(request.continuation, start=num_prefix):
            is_id = t < len(texts) and str(texts[t]).startswith(TOKEN_ID_PREFIX)
            if is_id and (echoed := self._key_to_id(texts[t])) != tok:
                raise EngineError(f"engine '{self.name}': the server echoed token {echoed} at prompt index {t} "
                                  f"where the prompt has {tok}")
            if token_lps[t] is None or tops[t] is None:
                raise EngineError(f"engine '{self.name}': the server echoed no logprobs at prompt index {t}")
            logprob = float(token_lps[t])
            entries = self._top_ids(tops[t])
            if any(tid == tok for tid, _ in entries):
                rank = 1 + sum(1 for tid, other in entries if tid != tok and other > logprob)
            else:
                rank = request.top_k + 1
            tokens.append(ScoredToken(tok, logprob, rank, tuple(sorted(entries, key=lambda e: -e[1])[: request.top_k])))
        return tuple(tokens)
