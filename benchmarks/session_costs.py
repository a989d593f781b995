"""What a call's fixed part is made of, and what vLLM's streaming-input sessions would save of it.

A step-level strategy makes a call per drafted step, per verification and per target piece; each
is a new vLLM request that reads its prefix from the prefix cache. On the CPU build a cache block
is 32 tokens (the CPU attention kernels' smallest), so a new request recomputes the up-to-31
tokens of its prefix past the last full block, and pays the request's own admission and output.
vLLM 0.32's streaming-input sessions (``AsyncLLM.generate`` over an async generator of
``StreamingInput``; a *resumable* request) keep one request and its KV cache, partial block
included, between chunks: a chunk appends prompt tokens to what the request holds.

For the target (the bundled 1.5B, no token-level method: sessions and the spec-decode proposers
are not combined here), greedy, batch 1, on GSM8K test problems 4-7 in the reasoning chat followed
by target-only's committed response (the speed run's samples), a prefix of the opening and up to
300 response tokens; timed, one token out each:

* ``call{N}``: a new request on the prefix plus the next N tokens, the prefix computed before
  (the fixed part at N = 1 includes the prefix's tail past its last full block);
* ``aligned{N}``: the same with the prefix cut to a multiple of 32 tokens (no tail to recompute);
* ``session{N}``: a session whose first chunk was the prefix, then a chunk of the next N tokens;
* ``verify51``: a new request's 51 tokens with prompt logprobs (k=1), as the likelihood verifier asks;
  ``verify51_session``: the same as a session chunk (``findings`` says where vLLM returns none).

Medians over problems 5-7 (problem 4 warms up). Results go to ``--json`` with the CPU model.

    python benchmarks/session_costs.py --json benchmarks/measured/cost_model_cpu/session_costs.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from call_costs import SAMPLES, write_result  # noqa: E402
from stepspec.engine.config import EnginePair, build_engines  # noqa: E402
from stepspec.engine.dtype import cpu_info  # noqa: E402
from stepspec.orchestrator.stepgen import opening_prompt  # noqa: E402

BLOCK = 32


async def fresh(llm, ids: list[int], **params) -> float:
    """Seconds of one new request on ``ids`` (one token out)."""
    from vllm import SamplingParams, TokensPrompt

    t0 = time.perf_counter()
    async for _ in llm.generate(TokensPrompt(prompt_token_ids=ids), SamplingParams(max_tokens=1, temperature=0.0,
                                                                                   **params),
                                request_id=f"fresh-{time.monotonic_ns()}"):
        pass
    return time.perf_counter() - t0


async def session(llm, prefix: list[int], chunk: list[int], **params) -> float:
    """Seconds from handing a session ``chunk`` (after a first chunk of ``prefix``) to its token."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.engine.protocol import StreamingInput
    from vllm.sampling_params import RequestOutputKind

    second, done = asyncio.Event(), asyncio.Event()
    plain = SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.DELTA)

    async def inputs():
        yield StreamingInput(TokensPrompt(prompt_token_ids=prefix))
        await second.wait()
        yield StreamingInput(TokensPrompt(prompt_token_ids=chunk),
                             SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.DELTA,
                                            **params))
        await done.wait()

    outputs, t0, took, scored = 0, 0.0, 0.0, 0
    async for out in llm.generate(inputs(), plain, request_id=f"session-{time.monotonic_ns()}"):
        if out.outputs and out.outputs[0].token_ids:
            outputs += 1
            if outputs == 1:
                t0 = time.perf_counter()
                second.set()
            elif outputs == 2:
                took = time.perf_counter() - t0
                scored = sum(p is not None for p in out.prompt_logprobs or ())
                done.set()
    if params.get("prompt_logprobs") is not None and scored < len(chunk):
        raise RuntimeError(f"the session's chunk came back with prompt logprobs for {scored} of {len(chunk)} tokens")
    return took


async def main(out: Path | None) -> None:
    rows = [json.loads(line) for line in SAMPLES.read_text().splitlines()][4:8]
    target, _ = EnginePair(kv_cache_gib=1.5, target_spec="none", draft_spec="none").engines()
    engine = build_engines({"target": target})["target"]
    await engine.start()
    llm = engine._llm
    times: dict[str, list[float]] = {}
    findings: dict[str, str] = {}
    try:
        for row in rows:
            opening = await opening_prompt(engine, row["question"])
            ids = engine.encode(opening + row["response"])
            end = min(len(engine.encode(opening)) + 300, len(ids) - 100)
            prefix = ids[:end] if end % BLOCK else ids[:end - 7]  # a tail past the last full block
            aligned = ids[:len(prefix) // BLOCK * BLOCK]
            for n in (1, 51):
                for name, head in (("call", prefix), ("aligned", aligned)):
                    await engine.reset_caches()
                    await fresh(llm, head)
                    times.setdefault(f"{name}{n}", []).append(await fresh(llm, ids[:len(head) + n]))
                await engine.reset_caches()
                times.setdefault(f"session{n}", []).append(await session(llm, prefix, ids[len(prefix):len(prefix) + n]))
            await engine.reset_caches()
            await fresh(llm, prefix)
            verified = await fresh(llm, ids[:len(prefix) + 51], prompt_logprobs=1, detokenize=False,
                                   skip_reading_prefix_cache=False)
            times.setdefault("verify51", []).append(verified)
            try:
                await engine.reset_caches()
                times.setdefault("verify51_session", []).append(
                    await session(llm, prefix, ids[len(prefix):len(prefix) + 51], prompt_logprobs=1, detokenize=False))
            except RuntimeError as e:  # reported: whether sessions return prompt logprobs is a finding
                times.pop("verify51_session", None)
                findings["verify51_session"] = str(e)
            print(row["doc_id"], {k: round(v[-1], 4) for k, v in times.items()}, flush=True)
    finally:
        await engine.close()
    result = {"cpu": cpu_info(), "engine": "target (none)", "block": BLOCK, "findings": findings,
              "seconds": {name: round(statistics.median(ts[1:]), 4) for name, ts in times.items()}}
    write_result(result, out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    asyncio.run(main(parser.parse_args().json))
