"""A scripted engine for control-flow tests: the Engine protocol with no model.

Features are proven on real vLLM elsewhere; this only lets tests choose what a
model "says" and see what it was asked.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Callable, Mapping, Sequence

from stepspec.engine.stats import EngineStats
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

# A "token" of the scripted engines: a word with the whitespace before it, so that
# the token texts of a completion join back to its text.
TOKEN = re.compile(r"\s*\S+")


class WordTokenizer:
    """What a tool parser is built with: a vocabulary (the scripted engines' words)."""

    all_special_ids: tuple[int, ...] = ()  # no token of the scripted vocabulary ends generation by itself

    def get_vocab(self) -> dict[str, int]:
        return {}


class ScriptedEngine:
    # One vocabulary for every scripted engine, as a real pair shares its tokenizer.
    vocab: dict[str, int] = {}

    """``next_token`` maps a prompt to [(token_text, logprob), ...];
    ``continuation`` maps a prompt to the text generated; ``token_logprob`` maps
    the generated text to the logprob of each of its tokens (words), returned
    when a request asks for logprobs; ``token_scores`` maps (prefix, continuation token
    texts) to (logprob, rank, the engine's own token text or None) per token, what
    ``score_continuations`` returns (default: every token is the top choice at 0.0)."""

    def __init__(
        self,
        name: str = "scripted",
        next_token: Callable[[str], Sequence[tuple[str, float]]] | None = None,
        continuation: Callable[[str], str] | None = None,
        token_logprob: Callable[[str], float] | None = None,
        token_scores: Callable[[str, list[str]], Sequence[tuple[float, int, str | None]]] | None = None,
        delay: float | None = None,
        renders_tools: bool = False,
        max_model_len: int | None = None,
    ) -> None:
        self.name = name
        self.max_model_len = max_model_len
        self.renders_tools = renders_tools  # its template renders tools (else it ignores them, as older templates)
        self.tokenizer = WordTokenizer()
        self._next_token = next_token or (lambda prompt: [("0", 0.0)])
        self._continuation = continuation or (lambda prompt: "")
        self._token_logprob = token_logprob or (lambda text: 0.0)
        self._token_scores = token_scores or (lambda prefix, tokens: [(0.0, 1, None)] * len(tokens))
        self.delay = delay  # seconds each generate call waits (yielding to other traces); None: no wait
        self.scored: list[tuple[str, list[str]]] = []  # (prefix, continuation tokens) per scored request
        self.prompts: list[str] = []
        self.samplings: list[Sampling] = []  # each generated request's sampling, in order
        self.num_calls = 0
        self.running = 0
        self.num_cancelled = 0  # calls cancelled while waiting
        self.started = False
        self._stats = EngineStats()

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(name=self.name, backend="scripted", model=self.name, max_model_len=self.max_model_len)

    async def start(self) -> None:
        self.started = True

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.num_calls += 1
        if self.delay is not None:
            self.running += 1  # calls waiting now (a cancelled one ends, as an aborted request)
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:
                self.num_cancelled += 1
                raise
            finally:
                self.running -= 1
        results = []
        for r in requests:
            self.prompts.append(str(r.prompt))
            self.samplings.append(r.sampling)
            text = self._continuation(str(r.prompt))
            reason, stop_string = FinishReason.EOS, None
            hits = [(text.index(s), s) for s in r.sampling.stop if s in text]
            if hits:  # the earliest stop string wins, as in vLLM
                at, stop_string = min(hits)
                text, reason = text[:at], FinishReason.STOP
            words = text.split()
            if len(words) > r.sampling.max_tokens:  # the leading space stays: a continuation's first word has it
                lead = text[:len(text) - len(text.lstrip())]
                text, reason, stop_string = lead + " ".join(words[: r.sampling.max_tokens]), FinishReason.LENGTH, None
            tokens = TOKEN.findall(text)
            ids = tuple(self.token_id(t) for t in tokens)
            logprobs = None
            if r.sampling.logprobs is not None:
                lp = self._token_logprob(text)
                logprobs = tuple(TokenLogprob(i, w, lp, ((i, w, lp),)) for i, w in zip(ids, tokens))
            completion = Completion(text=text, token_ids=ids, finish_reason=reason, stop_string=stop_string,
                                    logprobs=logprobs)
            results.append(GenerationResult((completion,) * r.sampling.n, self.count_tokens(str(r.prompt))))
        return results

    async def next_token_logprobs(self, prompts: Sequence[Prompt], top_k: int = 20) -> list[NextTokenDistribution]:
        self.num_calls += 1
        out = []
        for p in prompts:
            self.prompts.append(str(p))
            entries = sorted(self._next_token(str(p)), key=lambda e: -e[1])[:top_k]
            out.append(NextTokenDistribution(tuple((i, t, lp) for i, (t, lp) in enumerate(entries)),
                                             self.count_tokens(str(p))))
        return out

    def token_id(self, text: str) -> int:
        return self.vocab.setdefault(text, len(self.vocab))

    async def score_continuations(self, requests: Sequence[ContinuationRequest]) -> list[ContinuationScores]:
        self.num_calls += 1
        texts = {i: t for t, i in self.vocab.items()}
        out = []
        for r in requests:
            tokens = [texts[i] for i in r.continuation]
            self.scored.append((str(r.prefix), tokens))
            scored = []
            for tid, (lp, rank, own) in zip(r.continuation, self._token_scores(str(r.prefix), tokens)):
                top = ((tid if rank == 1 or own is None else self.token_id(own), 0.0 if rank > 1 else lp),)
                scored.append(ScoredToken(tid, lp, rank, top))
            out.append(ContinuationScores(tuple(scored), self.count_tokens(str(r.prefix)) + len(tokens)))
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        def text(m):
            calls = "".join(f"<tool_call>{json.dumps(c['function'])}</tool_call>" for c in m.get("tool_calls") or ())
            return (m.get("content") or "") + calls

        shown = tools and self.renders_tools
        parts = ([f"<|tools|>{json.dumps([t['function']['name'] for t in tools])}"] if shown else []) + \
            [f"<|{m['role']}|>{text(m)}" for m in messages]
        text = "\n".join(parts)
        if continue_final_message:
            return text
        return text + ("\n<|assistant|>" if add_generation_prompt else "")

    async def aapply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                                   continue_final_message: bool = False,
                                   tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        return self.apply_chat_template(messages, add_generation_prompt, continue_final_message, tools)

    async def acount_tokens(self, text: str) -> int:
        return self.count_tokens(text)

    async def aencode(self, text: str) -> list[int]:
        return [self.token_id(t) for t in re.findall(r"\s*\S+|\s+$", text)]  # trailing whitespace: a token

    async def adecode(self, token_ids: Sequence[int]) -> str:
        texts = {i: t for t, i in self.vocab.items()}
        return "".join(texts[i] for i in token_ids)

    def stats(self) -> EngineStats:
        return self._stats.snapshot()

    async def close(self) -> None:
        pass
