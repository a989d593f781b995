"""What one pass of token-level speculation costs on this machine, against each model decoding alone.

One engine per run (start it in its own process, one at a time): the 1.5B alone (``none``), the
0.5B alone (``draft0``), or the 1.5B with the 0.5B proposing ``K`` tokens a pass (``draft``). It
writes 200 greedy tokens for GSM8K test problems 200-202 twice, prefix cache reset before each,
and reports the second round: tokens, seconds, passes (the engine's speculation counters; one per
token without speculation), tokens per pass and seconds per pass, as one JSON line.

    python benchmarks/token_pass_cost.py 0 none
    python benchmarks/token_pass_cost.py 0 draft0
    python benchmarks/token_pass_cost.py 3 draft
    python benchmarks/token_pass_cost.py 6 draft
    python benchmarks/token_pass_cost.py 6 draft '{"max_rank": 2, "floor": -2, "math_max_rank": 1}'

A pass of ``draft`` costs about K decode steps of the 0.5B plus one forward of the 1.5B over K + 1
positions: the numbers say how much of a pass is the proposer's own decoding.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from stepspec.engine.models import BUNDLED_DRAFT, BUNDLED_TARGET, resolve_model
from stepspec.engine.token_accept import AcceptRule
from stepspec.engine.types import GenerationRequest, Sampling
from stepspec.engine.vllm_backend import VLLMEngine
from stepspec.orchestrator.stepgen import opening_prompt
from stepspec.workflows.eval.datasets import load_problems


async def main(k: int, method: str, accept: AcceptRule | None) -> None:
    target, draft = resolve_model(BUNDLED_TARGET), resolve_model(BUNDLED_DRAFT)
    spec = {"model": draft, "num_speculative_tokens": k} if method == "draft" else None
    engine = VLLMEngine(draft if method == "draft0" else target, name=method, speculative_config=spec, accept=accept)
    await engine.start()
    problems = load_problems("gsm8k")[200:203]
    measured = []
    try:
        for round_ in range(2):
            for p in problems:
                prompt = await opening_prompt(engine, p.question)
                await engine.reset_caches()
                before = engine.stats().spec_decoding
                t0 = time.perf_counter()
                (r,) = await engine.generate([GenerationRequest(prompt, Sampling(max_tokens=200))])
                seconds = time.perf_counter() - t0
                sd = engine.stats().spec_decoding.minus(before)
                if round_:
                    measured.append((len(r.completion.token_ids), seconds, sd.num_drafts))
    finally:
        await engine.close()
    tokens, seconds = sum(m[0] for m in measured), sum(m[1] for m in measured)
    passes = sum(m[2] for m in measured) or tokens
    print(json.dumps({"method": method, "k": k, "accept": accept.model_dump() if accept else None,
                      "cpu": engine.info.dtype_reason, "tokens": tokens, "s": round(seconds, 2),
                      "tok_s": round(tokens / seconds, 2), "passes": passes,
                      "tok_per_pass": round(tokens / passes, 2), "s_per_pass": round(seconds / passes, 4)}), flush=True)


if __name__ == "__main__":
    rule = AcceptRule.model_validate_json(sys.argv[3]) if len(sys.argv) > 3 else None
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], rule))
