"""Token-level speculation across sibling samples: does the target decode sampled siblings faster?

STAND (2025) observes that the sampled reasoning paths of one problem reuse each other's
n-grams, and drafts tokens for one path from the others (60-65% lower latency reported).
vLLM's suffix decoding draws drafts from the prompt and from earlier requests' outputs.
This script measures, with the target alone, at temperature 0.7:

* inside ``best-of-n-target`` (n solutions in one batched call) and ``tree-target``
  (k candidates per branch, batched per depth), as the strategies run them;
* ``siblings``: the same n solutions written one after another, so that each can draw
  on the ones before it (the most suffix decoding could share here).

Each with no token speculation, suffix decoding and the draft model (the 0.5B) inside
the 1.5B; engines are started one at a time, ``none`` first and last (the machine's
drift). Ratios are tokens/s against the mean of the two ``none`` runs.

    python benchmarks/sibling_speculation.py [--problems 1] [--n 4] [--max-tokens 160] [--json out.json]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.token_speculation import pair_arguments  # noqa: E402
from stepspec.engine.models import resolve_model  # noqa: E402
from stepspec.engine.speculation import speculative_config, suffix_available  # noqa: E402
from stepspec.engine.types import GenerationRequest, Sampling  # noqa: E402
from stepspec.engine.vllm_backend import VLLMEngine  # noqa: E402
from stepspec.judges.likelihood import LikelihoodJudge  # noqa: E402
from stepspec.orchestrator.budget import Budget  # noqa: E402
from stepspec.orchestrator.stepgen import opening_prompt  # noqa: E402
from stepspec.orchestrator.strategies import STRATEGIES  # noqa: E402
from stepspec.workflows.eval.datasets import load_problems  # noqa: E402

TEMPERATURE = 0.7


async def measure(engine: VLLMEngine, work) -> dict:
    """Tokens, seconds and token-level acceptance of ``work()``'s target calls."""
    before, generated = engine.stats().spec_decoding, engine.stats().num_output_tokens
    t = time.perf_counter()
    await work()
    seconds = time.perf_counter() - t
    spec = engine.stats().spec_decoding.minus(before)
    tokens = engine.stats().num_output_tokens - generated
    return {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
            "acceptance_rate": spec.acceptance_rate, "mean_acceptance_length": spec.mean_acceptance_length}


async def run_method(method: str, args, questions: list[str]) -> dict:
    config = speculative_config(method, draft_model=resolve_model(args.draft))
    engine = VLLMEngine(resolve_model(args.target), name=f"target[{method}]", max_model_len=4096, kv_cache_gib=1.5,
                        speculative_config=config)
    await engine.start()
    judge = LikelihoodJudge(engine)
    budget = Budget(max_tokens=args.max_tokens, max_step_tokens=min(128, args.max_tokens))
    try:
        warm = await opening_prompt(engine, "What is 1 + 1?")
        await engine.generate([GenerationRequest(warm, Sampling(max_tokens=8))])  # warm-up
        out: dict[str, list[dict]] = {"best-of-n-target": [], "tree-target": [], "siblings": []}
        for q in questions:
            out["best-of-n-target"].append(await measure(engine, lambda: STRATEGIES["best-of-n-target"].run(
                q, target=engine, judge=judge, n=args.n, temperature=TEMPERATURE, budget=budget)))
            out["tree-target"].append(await measure(engine, lambda: STRATEGIES["tree-target"].run(
                q, target=engine, judge=judge, k=3, beam=2, temperature=TEMPERATURE, budget=budget)))
            prompt = await opening_prompt(engine, q)

            async def one_by_one() -> None:
                for seed in range(args.n):
                    await engine.generate([GenerationRequest(prompt, Sampling(
                        max_tokens=args.max_tokens, temperature=TEMPERATURE, seed=seed))])

            out["siblings"].append(await measure(engine, one_by_one))
    finally:
        await engine.close()
    return {"method": method, "speculative_config": config, "runs": out}


def summary(runs: list[dict]) -> dict[str, dict[str, dict]]:
    """Per workload and method: tokens/s over all problems, its ratio to ``none``, acceptance."""
    table: dict[str, dict[str, dict]] = {}
    base = {}
    for workload in runs[0]["runs"]:
        nones = [r for r in runs if r["method"] == "none"]
        base[workload] = statistics.mean(sum(x["tokens"] for x in r["runs"][workload]) /
                                         sum(x["seconds"] for x in r["runs"][workload]) for r in nones)
        for r in runs:
            xs = r["runs"][workload]
            tps = sum(x["tokens"] for x in xs) / sum(x["seconds"] for x in xs)
            rates = [x["acceptance_rate"] for x in xs if x["acceptance_rate"] is not None]
            table.setdefault(workload, {}).setdefault(r["method"], {
                "tokens_per_second": tps, "vs_none": tps / base[workload],
                "acceptance_rate": statistics.mean(rates) if rates else None,
                "latency_reduction": 1 - base[workload] / tps})
    return table


async def main(args) -> dict:
    questions = [p.question for p in load_problems("gsm8k", args.data_dir)[: args.problems]]
    methods = ["none"] + (["suffix"] if suffix_available() else []) + ["draft", "none"]
    runs = []
    for m in methods:
        print(f"running {m} ...", file=sys.stderr, flush=True)
        runs.append(await run_method(m, args, questions))
    table = summary(runs)
    nones = [r for r in runs if r["method"] == "none"]
    drift = {w: (sum(x["tokens"] for x in nones[-1]["runs"][w]) / sum(x["seconds"] for x in nones[-1]["runs"][w])) /
             (sum(x["tokens"] for x in nones[0]["runs"][w]) / sum(x["seconds"] for x in nones[0]["runs"][w]))
             for w in table}
    print(f"\nTarget {args.target}, {len(questions)} GSM8K problems, temperature {TEMPERATURE}, n={args.n}, "
          f"{args.max_tokens} max tokens")
    print(f"{'workload':<17} {'method':<7} {'tok/s':>7} {'vs none':>8} {'latency -':>9} {'accept':>7}")
    for workload, by_method in table.items():
        for method, row in by_method.items():
            acc = "-" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.3f}"
            print(f"{workload:<17} {method:<7} {row['tokens_per_second']:>7.2f} {row['vs_none']:>7.2f}x "
                  f"{row['latency_reduction']:>8.0%} {acc:>7}")
    print("baseline drift (last none / first none): " + ", ".join(f"{w} {d:.3f}" for w, d in drift.items()))
    report = {"target": args.target, "draft": args.draft, "temperature": TEMPERATURE, "n": args.n,
              "max_tokens": args.max_tokens, "problems": len(questions), "summary": table, "drift": drift,
              "runs": runs}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    parser = pair_arguments(__doc__, problems=1, max_tokens=160)
    parser.add_argument("--n", type=int, default=4, help="samples per problem (best-of-n-target, siblings)")
    asyncio.run(main(parser.parse_args()))
