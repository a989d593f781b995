"""The HTTP backend: an :class:`stepspec.engine.protocol.Engine` over an OpenAI-compatible server.

Built for vLLM's server (``vllm serve`` / ``python -m vllm.entrypoints.openai.api_server``)
and meant to behave exactly like the in-process :class:`stepspec.engine.vllm_backend.VLLMEngine`
on the same model: same greedy text, same token ids, same finish reasons. SGLang's
server also works for :meth:`OpenAIEngine.generate` and
:meth:`OpenAIEngine.next_token_logprobs`.

How the protocol maps onto the server:

* ``generate``: one ``POST /v1/completions`` per :class:`GenerationRequest`, all sent
  concurrently (at most ``max_concurrency`` in flight), so the server batches them.
  Text prompts are sent as text with ``add_special_tokens: false`` (the in-process
  backend adds none either); token-id prompts are sent as a list of ints. The server
  returns the generated token ids (``return_token_ids``) and, when logprobs are asked,
  keys them by token id (``return_tokens_as_token_ids``: ``"token_id:123"``); the text
  of each token id comes from the local tokenizer when there is one, else from the
  server's ``/detokenize`` (cached per id).
* ``finish_reason``: ``"length"`` -> LENGTH; ``"stop"`` with a string ``stop_reason``
  (SGLang: ``matched_stop``) -> STOP with that stop string; ``"stop"`` otherwise -> EOS.
* cached prompt tokens: ``usage.prompt_tokens_details.cached_tokens``, which vLLM only
  reports when started with ``--enable-prompt-tokens-details``; None otherwise.
* speculative decoding: vLLM's per-request ``metrics.speculative_decoding`` (present
  when the server speculates with per-request spec-decode metrics enabled) becomes
  ``Completion.spec_decoding`` and is folded into :meth:`OpenAIEngine.stats`.
* ``score_continuations``: one ``POST /v1/completions`` per :class:`ContinuationRequest`
  with the prompt as token ids (prefix + continuation), ``max_tokens: 1``, greedy, read
  two ways; which one an engine uses is found on its first call and logged at INFO:

  - ``prompt_logprobs`` (vLLM): each prompt position's token with its exact logprob and
    rank, and the model's top-k there. vLLM's server cannot be told to read the prefix
    cache for such a request (its completion API has no ``skip_reading_prefix_cache``,
    and a request with prompt logprobs skips the cache by default), so every scoring
    request prefills its whole prompt, unlike the in-process backend.
  - ``echo`` + ``logprobs`` (servers that ignore or refuse ``prompt_logprobs``): the echoed
    prompt's ``token_logprobs`` and ``top_logprobs``. The rank is then counted from the
    top list, so a token outside the top-k is reported with rank ``top_k + 1``.

  A server that reports cached prompt tokens reaching into the continuation would have
  read garbage logprobs from its cache; that request is sent again with a fresh
  ``cache_salt`` (vLLM: no cache hit), and it is an error if the cache is still read.
* ``encode`` / ``count_tokens`` / ``apply_chat_template`` are synchronous and send
  nothing: they use the tokenizer :meth:`OpenAIEngine.start` loads in a worker thread
  (the ``tokenizer`` argument, else the served model's ``root`` from ``/v1/models``,
  vLLM's path or Hugging Face id of the model, when this machine has it). Without
  one they raise an EngineError naming the fix, and the async paths tokenize on the
  server (``/tokenize``, ``/detokenize``).

Everything that talks to the server is async and goes through one request path, retried
by tenacity: connection errors (refused, or dropped by a server that died mid-request),
5xx and 429 (waiting at least its ``Retry-After``) are retried ``max_retries`` times with
exponential backoff (0.5 + 1 + 2 s by default, so a dead server is reported within
seconds); other 4xx never are. Failures raise :class:`stepspec.engine.protocol.EngineError`
naming the problem and the fix. A server that stops answering is an
:class:`stepspec.engine.protocol.EngineUnavailableError` naming its URL, whether it answered at
:meth:`OpenAIEngine.start` (then it crashed or was stopped mid-run), and the fix.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Self

import httpx
import tenacity

from stepspec.engine.openai_http import (
    REPLACEMENT_CHAR,
    RETRYABLE_TRANSPORT_ERRORS,
    TOKEN_ID_PREFIX,
    RetryableStatus,
    ServerConnection,
    gather_or_cancel,
    model_cards,
    normalize_base_url,
    request_spec_stats,
)
from stepspec.engine.openai_scoring import ECHO, PROMPT_LOGPROBS, ContinuationScoring
from stepspec.engine.protocol import EngineError
from stepspec.engine.stats import EngineStats, SpecDecodingStats
from stepspec.engine.session import DEFAULT_SESSION_HEADER
from stepspec.engine.types import (
    Completion,
    EngineInfo,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    NextTokenDistribution,
    Prompt,
    Sampling,
    TokenLogprob,
)

logger = logging.getLogger(__name__)


class OpenAIEngine(ServerConnection, ContinuationScoring):
    """An :class:`stepspec.engine.protocol.Engine` over an OpenAI-compatible HTTP server.

    * ``base_url``: the server root, e.g. ``http://127.0.0.1:8000`` (a trailing
      ``/v1`` is accepted).
    * ``model``: the served model name (vLLM's ``--served-model-name``).
    * ``api_key`` or ``api_key_env`` (the name of an environment variable holding
      it): sent as a bearer token.
    * ``timeout_s``: per HTTP request; ``max_retries``: retries after the first
      attempt for connection errors, 5xx and 429, with backoff
      ``retry_backoff_s * 2**attempt``.
    * ``max_model_len``: the server's context window; read from ``/v1/models`` at
      :meth:`start` when not given. ``max_tokens`` is capped at it.
    * ``tokenizer``: a local path or Hugging Face id of the model's tokenizer, loaded
      at :meth:`start`, for ``count_tokens``, ``apply_chat_template`` and token texts
      (default: the served model's ``root`` when this machine has it; pass one where it
      does not, or where the server was started with its own ``--tokenizer``).
    * ``session_header``: the header that carries the calling trace's session id
      (:mod:`stepspec.engine.session`), so a prefix-aware router keeps a trace on one replica;
      None sends none.
    * ``continuation_scoring``: how :meth:`score_continuations` reads the server's
      logprobs: ``"prompt_logprobs"`` (vLLM), ``"echo"`` (``echo`` + ``logprobs``), or
      ``"auto"`` (the first call finds out; :attr:`scoring_mode` then says which).
    """

    backend = "openai"

    def __init__(self, base_url: str, model: str, *, name: str | None = None, api_key: str | None = None,
                 api_key_env: str | None = None, timeout_s: float = 120.0, max_retries: int = 3,
                 max_model_len: int | None = None, tokenizer: str | None = None, max_concurrency: int = 64,
                 retry_backoff_s: float = 0.5, continuation_scoring: str = "auto",
                 session_header: str | None = DEFAULT_SESSION_HEADER) -> None:
        who = f"engine '{name or model}'"
        if api_key is not None and api_key_env is not None:
            raise EngineError(f"{who}: pass api_key or api_key_env, not both")
        if api_key_env is not None:
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise EngineError(f"{who}: api_key_env={api_key_env!r} names an environment variable that is not "
                                  f"set (or empty); export {api_key_env}=<key> or pass api_key directly")
        if max_retries < 0:
            raise EngineError(f"{who}: max_retries must be >= 0, got {max_retries}")
        if timeout_s <= 0:
            raise EngineError(f"{who}: timeout_s must be > 0, got {timeout_s}")
        if continuation_scoring not in ("auto", PROMPT_LOGPROBS, ECHO):
            raise EngineError(f"{who}: continuation_scoring must be auto, {PROMPT_LOGPROBS} or {ECHO}; "
                              f"got {continuation_scoring!r}")
        if max_concurrency < 1:
            raise EngineError(f"{who}: max_concurrency must be >= 1, got {max_concurrency}")
        self.base_url = normalize_base_url(base_url)
        self.model, self.name = model, name or model
        self.timeout_s, self.max_retries = float(timeout_s), int(max_retries)
        self.retry_backoff_s, self.max_concurrency = float(retry_backoff_s), int(max_concurrency)
        self.max_model_len = max_model_len
        self.tokenizer_name = tokenizer
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session_header = session_header
        self._timeout = httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0))
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type((*RETRYABLE_TRANSPORT_ERRORS, RetryableStatus)),
            stop=tenacity.stop_after_attempt(self.max_retries + 1), wait=self._backoff,
            before_sleep=tenacity.before_sleep_log(logger, logging.DEBUG), reraise=True)
        self._tokenizer = None
        self._root: str | None = None  # the served model's path or HF id (its /v1/models card)
        self._token_texts: dict[int, str] = {}
        self._started = False
        self._starting: asyncio.Task | None = None
        self._stats = EngineStats()
        # How score_continuations reads logprobs from this server (PROMPT_LOGPROBS or
        # ECHO); None ("auto") until its first call finds out.
        self._scoring_mode: str | None = None if continuation_scoring == "auto" else continuation_scoring

    @property
    def scoring_mode(self) -> str | None:
        """How :meth:`score_continuations` reads logprobs here: ``"prompt_logprobs"``,
        ``"echo"``, or None before an ``"auto"`` engine's first call."""
        return self._scoring_mode

    # -- lifecycle -----------------------------------------------------------------

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(name=self.name, backend=self.backend, model=self.model,
                          max_model_len=self.max_model_len, speculative_method=None)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        """Check that the server answers and serves ``model``; learn max_model_len; load
        the tokenizer (in a worker thread). Concurrent callers share one start."""
        if self._started:
            return
        loop = asyncio.get_running_loop()
        if self._starting is None or self._starting.done() or self._starting.get_loop() is not loop:
            self._starting = loop.create_task(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        cards = model_cards(await self._request("GET", "/v1/models"))
        if self.model not in cards:
            raise self._model_not_served_error(list(cards))
        card = cards[self.model]
        if self.max_model_len is None and card.get("max_model_len") is not None:
            self.max_model_len = int(card["max_model_len"])
        self._root = card.get("root")
        if self._tokenizer is None and (self.tokenizer_name or self._root):
            self._tokenizer = await asyncio.to_thread(self._load_tokenizer)
        self._started = True

    async def close(self) -> None:
        client, self._client = self._client, None
        client_loop, self._client_loop = self._client_loop, None
        self._semaphore = None
        if client is not None:
            if client_loop is asyncio.get_running_loop():
                await client.aclose()
            else:
                # Opened under an event loop that has ended: its connections went with it.
                logger.debug("engine '%s': dropping an HTTP client of an ended loop", self.name)
        self._started = False

    # -- tokenizer -----------------------------------------------------------------

    def _load_tokenizer(self):
        """The ``tokenizer`` argument's tokenizer, else the served model's (``root``) when
        this machine has it (a folder, or in the Hugging Face cache), else None. Blocking:
        :meth:`start` runs it in a worker thread."""
        try:
            from transformers import AutoTokenizer

            if self.tokenizer_name is None:
                return AutoTokenizer.from_pretrained(self._root, local_files_only=True)
            return AutoTokenizer.from_pretrained(self.tokenizer_name)
        except Exception as e:  # transformers missing, not found, not a tokenizer
            if self.tokenizer_name is not None:
                raise EngineError(
                    f"engine '{self.name}': could not load tokenizer {self.tokenizer_name!r}: {e}. Pass the "
                    "model's local path or Hugging Face id (transformers must be installed), or leave "
                    "tokenizer unset to use the served model's."
                ) from e
            logger.info("engine '%s': the served model's tokenizer %r is not on this machine (%s); the server "
                        "tokenizes", self.name, self._root, e)  # fmt: skip
            return None

    @property
    def tokenizer(self):
        """The local tokenizer loaded at :meth:`start`; None when tokenizing on the server."""
        return self._tokenizer

    def _local_tokenizer(self):
        """The tokenizer the synchronous methods use: they never ask the server."""
        if self._tokenizer is not None:
            return self._tokenizer
        if not self._started:
            raise EngineError(f"engine '{self.name}' is not started; await engine.start() first (it loads the "
                              "tokenizer that encode, count_tokens and apply_chat_template use)")
        raise EngineError(
            f"engine '{self.name}': encode, count_tokens and apply_chat_template need the model's tokenizer on "
            f"this machine, and the server's model ({self._root!r}) is not here; pass tokenizer=<local path or "
            "Hugging Face id of the served model's tokenizer>"
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens added."""
        return list(self._local_tokenizer().encode(text, add_special_tokens=False))

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        return self._local_tokenizer().apply_chat_template(
            [dict(m) for m in messages], tools=[dict(t) for t in tools] if tools else None, tokenize=False,
            continue_final_message=continue_final_message,
            add_generation_prompt=add_generation_prompt and not continue_final_message)

    async def aapply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                                   continue_final_message: bool = False,
                                   tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """:meth:`apply_chat_template`, rendered by the server when this machine has no tokenizer:
        vLLM's ``/tokenize`` renders the template and tokenizes it, ``/detokenize`` gives the text
        back, and a re-encode proves the round trip lost nothing."""
        if self._tokenizer is not None:
            return self.apply_chat_template(messages, add_generation_prompt, continue_final_message, tools)
        payload = {"model": self.model, "messages": [dict(m) for m in messages],
                   "add_generation_prompt": add_generation_prompt and not continue_final_message,
                   "continue_final_message": continue_final_message,
                   **({"tools": [dict(t) for t in tools]} if tools else {})}
        ids = [int(t) for t in (await self._request("POST", "/tokenize", payload)).json()["tokens"]]
        text = await self.adecode(ids)
        if await self.aencode(text) != ids:
            raise EngineError(f"engine '{self.name}': the chat template the server renders does not survive a "
                              "detokenize/tokenize round trip, so its text cannot be recovered exactly; pass "
                              "tokenizer=<local path or Hugging Face id> to render it here")
        return text

    async def acount_tokens(self, text: str) -> int:
        return len(await self.aencode(text))

    async def aencode(self, text: str) -> list[int]:
        """:meth:`encode`, by the server's ``/tokenize`` when there is no local tokenizer."""
        if self._tokenizer is not None:
            return self.encode(text)
        payload = {"model": self.model, "prompt": text, "add_special_tokens": False}
        return [int(t) for t in (await self._request("POST", "/tokenize", payload)).json()["tokens"]]

    async def adecode(self, ids: Sequence[int]) -> str:
        """Text of a token id sequence: local tokenizer, else ``/detokenize``."""
        if self._tokenizer is not None:
            return self._tokenizer.decode(list(ids))
        payload = {"model": self.model, "tokens": [int(t) for t in ids]}
        return (await self._request("POST", "/detokenize", payload)).json()["prompt"]

    async def _single_texts(self, token_ids: set[int]) -> dict[int, str]:
        """Text of each token id decoded alone (cached: the vocabulary bounds it)."""
        missing = sorted(t for t in token_ids if t not in self._token_texts)
        if missing:
            texts = await gather_or_cancel([self.adecode([t]) for t in missing])
            self._token_texts.update(zip(missing, texts))
        return {t: self._token_texts[t] for t in token_ids}

    async def _correct_replacement(self, token_id: int, context: list[int], singles: Mapping[int, str]) -> str:
        """vLLM's fix of a token text ending in U+FFFD (a partial UTF-8 sequence).

        The same rule as ``vllm.v1.engine.logprobs.LogprobsProcessor._correct_decoded_token``:
        decode the token after up to 4 preceding sampled tokens; the text it completes
        is its own, and it is "" while the byte sequence is still incomplete.
        """
        context = context[-4:]
        for num_ctx in range(1, len(context) + 1):
            ctx = context[-num_ctx:]
            full = await self.adecode([*ctx, token_id])
            if full.endswith(REPLACEMENT_CHAR):
                continue
            clean_end = len(ctx)
            for j in range(len(ctx) - 1, -1, -1):
                if not singles.get(ctx[j], REPLACEMENT_CHAR).endswith(REPLACEMENT_CHAR):
                    break
                clean_end = j
            clean_prefix = await self.adecode(ctx[:clean_end]) if clean_end > 0 else ""
            if full.startswith(clean_prefix):
                return full[len(clean_prefix) :]
            return full[len(os.path.commonprefix([clean_prefix, full])) :]
        return ""

    async def _position_texts(self, position_ids: Sequence[Sequence[int]],
                              sampled: Sequence[int]) -> list[dict[int, str]]:
        """Token texts at each output position, as the in-process backend reports them.

        ``position_ids[i]``: the token ids with logprobs at position i; ``sampled``: the
        generated token ids, whose preceding ones give the context vLLM uses to correct
        partial UTF-8 tokens.
        """
        singles = await self._single_texts({t for ids in position_ids for t in ids} | set(sampled))
        out = []
        for i, ids in enumerate(position_ids):
            context = list(sampled[max(0, i - 4) : i])
            texts = {}
            for t in ids:
                text = singles[t]
                if text.endswith(REPLACEMENT_CHAR):
                    text = await self._correct_replacement(t, context, singles)
                texts[t] = text
            out.append(texts)
        return out

    # -- generation ----------------------------------------------------------------

    def _prompt_payload(self, prompt: Prompt) -> dict[str, Any]:
        if isinstance(prompt, str):
            if not prompt:
                raise EngineError(f"engine '{self.name}': empty prompt")
            # Prompt text is taken as it is, as by the in-process backend.
            return {"prompt": prompt, "add_special_tokens": False}
        ids = [int(t) for t in prompt]
        if not ids:
            raise EngineError(f"engine '{self.name}': empty prompt")
        if self.max_model_len is not None and len(ids) >= self.max_model_len:
            raise EngineError(f"engine '{self.name}': the prompt has {len(ids)} tokens but max_model_len is "
                              f"{self.max_model_len}; shorten the prompt (fewer steps or a smaller budget) or serve "
                              "the model with a larger --max-model-len")
        return {"prompt": ids}

    def _payload(self, prompt: Prompt, spec: Sampling) -> dict[str, Any]:
        max_tokens = spec.max_tokens
        if self.max_model_len is not None:
            # The server caps max_tokens at the room left in the context window
            # (finish_reason "length") but refuses one above the whole window.
            max_tokens = min(max_tokens, self.max_model_len)
        payload: dict[str, Any] = {"model": self.model, **self._prompt_payload(prompt), "max_tokens": max_tokens,
                                   "temperature": spec.temperature, "top_p": spec.top_p, "n": spec.n,
                                   "return_token_ids": True}
        if spec.seed is not None:
            payload["seed"] = spec.seed
        if spec.stop:
            payload.update(stop=list(spec.stop), include_stop_str_in_output=spec.include_stop_str)
        if spec.logprobs is not None:
            payload.update(logprobs=spec.logprobs, return_tokens_as_token_ids=True)
        if spec.structured is not None:
            payload["structured_outputs"] = spec.structured.params()  # vLLM's field
        return payload

    async def _complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        body = (await self._request("POST", "/v1/completions", payload)).json()
        if not body.get("choices"):
            raise EngineError(f"engine '{self.name}': the server answered /v1/completions with no choices: "
                              f"{str(body)[:500]}")
        return body

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        await self.start()
        payloads = [self._payload(r.prompt, r.sampling) for r in requests]
        t0 = time.perf_counter()
        bodies = await gather_or_cancel([self._complete(p) for p in payloads])
        results = await gather_or_cancel([self._to_result(r, b) for r, b in zip(requests, bodies)])
        self._stats.observe_generation(results, time.perf_counter() - t0)
        return results

    def _observe_spec_decoding(self, body: Mapping[str, Any]) -> SpecDecodingStats | None:
        """Fold a completion's token-level speculation counters into the engine's."""
        spec_stats = request_spec_stats(body)
        if spec_stats is not None:
            self._stats.spec_decoding.observe(spec_stats)
        return spec_stats

    @staticmethod
    def _usage(body: Mapping[str, Any]) -> tuple[int, int | None]:
        usage = body.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        return int(usage.get("prompt_tokens", 0)), (int(cached) if cached is not None else None)

    def _finish(self, choice: Mapping[str, Any]) -> tuple[FinishReason, str | None]:
        # vLLM: stop_reason; SGLang: matched_stop. A string is the stop string that
        # matched; an int or None is the model's EOS / stop token.
        stop_reason = choice["stop_reason"] if "stop_reason" in choice else choice.get("matched_stop")
        try:
            return FinishReason.from_vllm(choice.get("finish_reason"), stop_reason)
        except ValueError as e:
            raise EngineError(f"engine '{self.name}': {e}") from e

    def _token_ids(self, choice: Mapping[str, Any]) -> list[int]:
        ids = choice.get("token_ids")
        if ids is None:
            raise EngineError(f"engine '{self.name}': the server at {self.base_url} returned no token ids "
                              "(return_token_ids); use a vLLM >= 0.10 or SGLang server")
        return [int(t) for t in ids]

    def _key_to_id(self, key: str) -> int:
        """A logprobs key: ``token_id:N`` (vLLM), else token text (SGLang) -> its one id."""
        if key.startswith(TOKEN_ID_PREFIX):
            return int(key[len(TOKEN_ID_PREFIX) :])
        if self._tokenizer is None:
            raise EngineError(f"engine '{self.name}': the server keys logprobs by token text ({key!r}), not by "
                              "token id; pass tokenizer=<path or HF id> to map texts to ids, or use a vLLM server")
        ids = list(self._tokenizer.encode(key, add_special_tokens=False))
        if len(ids) != 1:
            raise EngineError(
                f"engine '{self.name}': the server keys logprobs by token text, and {key!r} does not map to one "
                f"token (got {ids}); use a vLLM server, which returns token ids (return_tokens_as_token_ids)"
            )
        return ids[0]

    def _top_ids(self, top: Mapping[str, float] | None) -> list[tuple[int, float]]:
        return [(self._key_to_id(k), float(lp)) for k, lp in (top or {}).items()]

    async def _to_result(self, request: GenerationRequest, body: Mapping[str, Any]) -> GenerationResult:
        num_prompt_tokens, num_cached = self._usage(body)
        spec_stats = self._observe_spec_decoding(body)
        completions = []
        for i, c in enumerate(sorted(body["choices"], key=lambda c: c.get("index", 0))):
            reason, stop_string = self._finish(c)
            ids = self._token_ids(c)
            logprobs = await self._completion_logprobs(c, ids) if request.sampling.logprobs is not None else None
            # The server reports spec-decode metrics only for n == 1: the first completion.
            completions.append(Completion(text=c["text"], token_ids=tuple(ids), finish_reason=reason,
                                          stop_string=stop_string, logprobs=logprobs,
                                          spec_decoding=spec_stats if i == 0 else None))
        return GenerationResult(completions=tuple(completions), num_prompt_tokens=num_prompt_tokens,
                                num_cached_prompt_tokens=num_cached)

    async def _completion_logprobs(self, choice: Mapping[str, Any], ids: list[int]) -> tuple[TokenLogprob, ...]:
        lp = choice.get("logprobs")
        if lp is None:
            raise EngineError(f"engine '{self.name}': logprobs asked but the server returned none")
        token_lps = lp.get("token_logprobs") or []
        tops = [self._top_ids(top) for top in lp.get("top_logprobs") or []]
        if len(token_lps) != len(ids) or len(tops) != len(ids):
            raise EngineError(f"engine '{self.name}': the server returned {len(token_lps)} logprobs and "
                              f"{len(tops)} top-logprob entries for {len(ids)} tokens")
        texts = await self._position_texts([[tok, *(t for t, _ in top)] for tok, top in zip(ids, tops)], ids)
        singles = await self._single_texts(set(ids))
        return tuple(
            # As in-process: the corrected text, else the token decoded alone.
            TokenLogprob(token_id=tok, token=pos_texts[tok] or singles[tok],
                         logprob=float(chosen) if chosen is not None else float("-inf"),
                         top=self._sorted_top(top, pos_texts))
            for tok, chosen, top, pos_texts in zip(ids, token_lps, tops, texts)
        )

    @staticmethod
    def _sorted_top(top: list[tuple[int, float]], texts: Mapping[int, str]) -> tuple[tuple[int, str, float], ...]:
        return tuple(sorted(((tid, texts[tid], lp) for tid, lp in top), key=lambda e: -e[2]))

    async def next_token_logprobs(self, prompts: Sequence[Prompt], top_k: int = 20) -> list[NextTokenDistribution]:
        """One-token greedy requests with ``top_k`` logprobs: a prefill and one decode step."""
        await self.start()
        if top_k < 1:
            raise EngineError(f"engine '{self.name}': top_k must be >= 1, got {top_k}")
        spec = Sampling(max_tokens=1, temperature=0.0, logprobs=top_k)
        payloads = [self._payload(p, spec) for p in prompts]
        t0 = time.perf_counter()
        bodies = await gather_or_cancel([self._complete(p) for p in payloads])
        tops = []
        for body in bodies:
            positions = (body["choices"][0].get("logprobs") or {}).get("top_logprobs") or []
            if not positions or positions[0] is None:
                raise EngineError(f"engine '{self.name}': logprobs asked but the server returned none for the "
                                  "next token")
            tops.append(self._top_ids(positions[0]))
        # The first output position: no sampled context, as in-process.
        texts = await gather_or_cancel([self._position_texts([[t for t, _ in top]], []) for top in tops])
        seconds = time.perf_counter() - t0
        results = []
        for body, top, [pos_texts] in zip(bodies, tops, texts):
            num_prompt_tokens, num_cached = self._usage(body)
            self._observe_spec_decoding(body)
            results.append(NextTokenDistribution(top=self._sorted_top(top, pos_texts)[:top_k],
                                                 num_prompt_tokens=num_prompt_tokens,
                                                 num_cached_prompt_tokens=num_cached))
        self._stats.observe_next_token(results, seconds)
        return results

    # -- stats ---------------------------------------------------------------------

    def stats(self) -> EngineStats:
        # the server's processes are not ours to measure
        return self._stats.snapshot()
