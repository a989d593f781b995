"""What one engine call costs on this machine, by its parts: the fixed part, a prefilled token, a
decoded token, and what prompt logprobs add to a verification.

For each engine (role x token-level method), one at a time, greedy, batch 1, on GSM8K test
problems 4-7 in the reasoning chat followed by target-only's committed response (the speed
run's samples): a prefix of the opening and up to 300 response tokens is computed first (caches
reset before each measurement), then timed:

* ``prefillN``: one call on the prefix plus the next N tokens, one token out (N = 1: the
  fixed part of a call, with the up-to-31 tokens past the last full 32-token cache block);
* ``decodeN``: one call on the prefix writing N + 1 tokens (ignore_eos);
* the target only, ``verifyK``: the 51-token continuation with prompt logprobs (K alternatives
  per position, as the likelihood verifier asks: 0 is the token's own logprob and rank only).

Medians over problems 5-7 (problem 4 warms up). Results go to ``--json`` with the CPU model.

    python benchmarks/call_costs.py --json benchmarks/measured/cost_model_cpu/call_costs.json
    python benchmarks/call_costs.py --engine target:draft:1 --engine target:draft:3 --engine target:draft:5 \
        --json benchmarks/measured/cost_model_cpu/call_costs_draft_inside.json
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

from stepspec.engine.config import EnginePair, build_engines  # noqa: E402
from stepspec.engine.dtype import cpu_info  # noqa: E402
from stepspec.orchestrator.stepgen import opening_prompt  # noqa: E402

SAMPLES = Path(__file__).parent / "measured/gsm8k100_speed_2026-12-05_cpu/samples_gsm8k_target-only.jsonl"
ENGINES = (("target", "suffix"), ("target", "none"), ("draft", "suffix"))


async def measure(role: str, method: str, rows: list[dict], k: int | None = None) -> dict[str, float]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    target, draft = EnginePair(kv_cache_gib=1.5, target_spec=method if role == "target" else "none",
                               draft_spec=method if role == "draft" else "none", num_speculative_tokens=k).engines()
    engine = build_engines({role: target if role == "target" else draft})[role]
    await engine.start()
    times: dict[str, list[float]] = {}

    async def timed(name: str, ids: list[int], prefix: list[int], **params) -> None:
        await engine.reset_caches()
        await engine._run_one(prefix, SamplingParams(max_tokens=1, temperature=0.0))
        t0 = time.perf_counter()
        await engine._run_one(ids, SamplingParams(temperature=0.0, detokenize=False,
                                                  output_kind=RequestOutputKind.FINAL_ONLY, **params))
        times.setdefault(name, []).append(time.perf_counter() - t0)

    try:
        for row in rows:
            opening = await opening_prompt(engine, row["question"])
            ids = engine.encode(opening + row["response"])
            prefix = ids[:min(len(engine.encode(opening)) + 300, len(ids) - 100)]
            for n in (1, 8, 24, 51, 100):
                await timed(f"prefill{n}", ids[:len(prefix) + n], prefix, max_tokens=1)
            for n in (1, 16, 64):
                await timed(f"decode{n}", prefix, prefix, max_tokens=n + 1, ignore_eos=True)
            if role == "target":
                for k in (0, 1, 5):
                    await timed(f"verify{k}", ids[:len(prefix) + 51], prefix, max_tokens=1, prompt_logprobs=k,
                                skip_reading_prefix_cache=False)
    finally:
        await engine.close()
    return {name: round(statistics.median(ts[1:]), 4) for name, ts in times.items()}


async def main(out: Path | None, engines: list[tuple[str, str, int | None]]) -> None:
    rows = [json.loads(line) for line in SAMPLES.read_text().splitlines()][4:8]
    result = {"cpu": cpu_info(), "engines": {}}
    for role, method, k in engines:
        name = f"{role} ({method}{'' if k is None else f', k={k}'})"
        result["engines"][name] = await measure(role, method, rows, k)
        print(name, result["engines"][name], flush=True)
    write_result(result, out)


def write_result(result: dict, out: Path | None) -> None:
    """Print ``result`` and write it to ``out`` (when given) as JSON."""
    print(json.dumps(result, indent=1), flush=True)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--engine", action="append", default=None, metavar="ROLE:METHOD[:K]",
                        help="an engine to measure, e.g. target:draft:3 (the 0.5B proposing 3 tokens inside the "
                             "target); repeatable; default: " + ", ".join(f"{r}:{m}" for r, m in ENGINES))
    args = parser.parse_args()
    chosen = [(r, m, None) for r, m in ENGINES]
    if args.engine:
        chosen = [(p[0], p[1], int(p[2]) if len(p) > 2 else None) for p in (e.split(":") for e in args.engine)]
    asyncio.run(main(args.json, chosen))
