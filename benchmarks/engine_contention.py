"""The two engines of the pair at once, against one at a time, on this machine's cores.

Under load a reasoner's draft engine and target engine decode at the same time (some traces
draft while others are written or verified by the target). Each engine is a vLLM process
whose OpenMP threads are bound to CPUs; this measures what running both costs against taking
turns, for two placements:

* ``shared``: both engines bound to every CPU (stepspec's default);
* ``split``: the draft on the first half of the CPUs, the target on the second half.

For each placement both engines start at the pair's defaults (dtype auto, the target with the
0.5B drafting its tokens, suffix decoding in the draft); then, caches reset before each, a batch
of ``--problems`` GSM8K openings of ``--max-tokens`` tokens is decoded by the target alone, by
the draft alone, and by both at once (the same two batches, gathered). ``turns`` is the sum of
the two alone; ``both / turns`` under 1 means running them together pays.

    python benchmarks/engine_contention.py [--problems 16] [--max-tokens 128] [--json FILE]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.token_speculation import pair_arguments  # noqa: E402
from stepspec.engine.dtype import cpu_info  # noqa: E402
from stepspec.engine.models import resolve_model  # noqa: E402
from stepspec.engine.speculation import speculative_config  # noqa: E402
from stepspec.engine.types import GenerationRequest, Sampling  # noqa: E402
from stepspec.engine.vllm_backend import VLLMEngine  # noqa: E402
from stepspec.orchestrator.stepgen import opening_prompt  # noqa: E402
from stepspec.workflows.eval.datasets import load_problems  # noqa: E402
from stepspec.workflows.eval.rundir import versions  # noqa: E402


def placements(cpus: list[int]) -> dict[str, dict[str, str]]:
    """VLLM_CPU_OMP_THREADS_BIND per role for each placement."""
    every = f"{cpus[0]}-{cpus[-1]}"
    half = len(cpus) // 2
    first, second = cpus[:half], cpus[half:]
    return {"shared": {"draft": every, "target": every},
            "split": {"draft": ",".join(map(str, first)), "target": ",".join(map(str, second))}}


async def start(role: str, model: str, drafter: str, bind: str, method: str) -> VLLMEngine:
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind  # read when vLLM spawns the engine's processes
    engine = VLLMEngine(model, name=f"{role}[{bind}]", max_model_len=2048, kv_cache_gib=1.0,
                        speculative_config=speculative_config(method, draft_model=drafter))
    await engine.start()
    return engine


async def timed(engines: list[VLLMEngine], batches: list[list[GenerationRequest]]) -> tuple[float, int]:
    for engine in engines:
        await engine.reset_caches()
    t = time.perf_counter()
    results = await asyncio.gather(*(e.generate(b) for e, b in zip(engines, batches)))
    seconds = time.perf_counter() - t
    return seconds, sum(r.completion.num_output_tokens for rs in results for r in rs)


async def measure(target: str, draft: str, questions: list[str], max_tokens: int, bind: dict[str, str]) -> dict:
    d = await start("draft", draft, draft, bind["draft"], "suffix")
    try:
        t = await start("target", target, draft, bind["target"], "draft")
        try:
            spec = Sampling(max_tokens=max_tokens)
            batches = {e: [GenerationRequest(await opening_prompt(e, q), spec) for q in questions] for e in (t, d)}
            for e in (t, d):  # first-call costs
                await e.generate(batches[e][:1])
            target_s, target_tok = await timed([t], [batches[t]])
            draft_s, draft_tok = await timed([d], [batches[d]])
            both_s, both_tok = await timed([t, d], [batches[t], batches[d]])
        finally:
            await t.close()
    finally:
        await d.close()
    return {"bind": bind, "target_seconds": target_s, "draft_seconds": draft_s, "both_seconds": both_s,
            "turns_seconds": target_s + draft_s, "both_over_turns": both_s / (target_s + draft_s),
            "target_tokens_per_second": target_tok / target_s, "draft_tokens_per_second": draft_tok / draft_s,
            "both_tokens": both_tok}


async def main(args) -> dict:
    target, draft = resolve_model(args.target), resolve_model(args.draft)
    questions = [p.question for p in load_problems("gsm8k", args.data_dir)[: args.problems]]
    cpus = sorted(os.sched_getaffinity(0))
    name, flags = cpu_info()
    result = {"cpu": {"model": name, "bf16_flags": list(flags)}, "cpus": cpus, "problems": args.problems,
              "max_tokens": args.max_tokens, "versions": versions(), "placements": {}}
    for placement, bind in placements(cpus).items():
        print(f"{placement} ...", file=sys.stderr, flush=True)
        r = result["placements"][placement] = await measure(target, draft, questions, args.max_tokens, bind)
        print(f"{placement}: target alone {r['target_seconds']:.1f} s ({r['target_tokens_per_second']:.1f} tok/s), "
              f"draft alone {r['draft_seconds']:.1f} s ({r['draft_tokens_per_second']:.1f} tok/s), "
              f"both at once {r['both_seconds']:.1f} s = {r['both_over_turns']:.2f}x of taking turns", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    asyncio.run(main(pair_arguments(__doc__, problems=16, max_tokens=128).parse_args()))
