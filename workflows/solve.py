"""Answer one question with the target model, token-level speculation underneath.

This is the main job of the first release: one problem, one engine, and the
token-level acceptance counters vLLM reports. Step-level strategies build on
the same engines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.models import resolve_model
from engine.speculation import speculative_config
from engine.stats import EngineStats
from engine.types import GenerationRequest, SamplingSpec
from orchestrator.prompts import reasoning_messages



@dataclass(frozen=True)
class SolveResult:
    question: str
    response: str
    answer: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str
    seconds: float  # wall time of the generation call alone
    startup_seconds: float  # engine start (model load, KV cache)
    stats: EngineStats

    @property
    def output_tokens_per_second(self) -> float:
        return self.num_output_tokens / self.seconds if self.seconds > 0 else 0.0


def build_prompt(engine, question: str) -> str:
    return engine.apply_chat_template(reasoning_messages(question))


async def solve(
    question: str,
    *,
    target: str,
    draft: str | None = None,
    spec: str = "draft",
    num_speculative_tokens: int | None = None,
    max_tokens: int = 512,
    kv_cache_gib: float = 1.0,
    max_model_len: int = 4096,
) -> SolveResult:
    from engine.vllm_backend import VLLMEngine
    from workflows.answers import extract_answer

    draft_path = resolve_model(draft) if (spec == "draft" and draft) else None
    config = speculative_config(spec, draft_model=draft_path, num_speculative_tokens=num_speculative_tokens)
    engine = VLLMEngine(
        resolve_model(target),
        name=target,
        kv_cache_gib=kv_cache_gib,
        max_model_len=max_model_len,
        speculative_config=config,
    )
    t0 = time.perf_counter()
    await engine.start()
    startup = time.perf_counter() - t0
    try:
        prompt = build_prompt(engine, question)
        t1 = time.perf_counter()
        (result,) = await engine.generate([GenerationRequest(prompt, SamplingSpec(max_tokens=max_tokens))])
        seconds = time.perf_counter() - t1
        stats = engine.stats()
    finally:
        await engine.close()
    c = result.completion
    return SolveResult(
        question=question,
        response=c.text,
        answer=extract_answer(c.text),
        num_prompt_tokens=result.num_prompt_tokens,
        num_output_tokens=c.num_output_tokens,
        finish_reason=c.finish_reason.value,
        seconds=seconds,
        startup_seconds=startup,
        stats=stats,
    )
