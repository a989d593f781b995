"""Step-level strategies side by side on GSM8K: accuracy, wall time, speedup over target-only.

One run, one pair of engines (started once) shared by every strategy. For each
problem, every strategy solves it in turn (the order rotates from problem to
problem) with both prefix caches reset before each solve, so no strategy rides
on another's cached prompt. Speedup is per problem: target-only's wall time
over the strategy's, then the median (and geometric mean) over problems.

    python benchmarks/step_strategies.py --limit 20 --out results/step_strategies

Writes ``results_<time>.json`` (settings and summary) and
``samples_<time>.jsonl`` (one line per problem and strategy, trace included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.models import BUNDLED_DRAFT, BUNDLED_TARGET, resolve_model  # noqa: E402
from engine.speculation import speculative_config  # noqa: E402
from engine.vllm_backend import VLLMEngine  # noqa: E402
from orchestrator.reasoner import Reasoner  # noqa: E402
from orchestrator.run import Budget, ReasoningError  # noqa: E402
from workflows.answers import gsm8k_reference, trace_answer  # noqa: E402
from workflows.datasets import load_problems  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=20, help="first N GSM8K test problems")
    p.add_argument("--strategies", default="target-only,specreason,lookahead")
    p.add_argument("--target", default=BUNDLED_TARGET)
    p.add_argument("--draft", default=BUNDLED_DRAFT)
    p.add_argument("--target-spec", default="none", help="token-level speculation in the target engine")
    p.add_argument("--draft-spec", default="none", help="token-level speculation in the draft engine")
    p.add_argument("--threshold", type=float, default=7.0, help="specreason score threshold")
    p.add_argument("--lookahead-judge", default="cascade")
    p.add_argument("--gamma", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="results/step_strategies")
    p.add_argument("--resume", default=None, metavar="SAMPLES_JSONL",
                   help="append to this samples file, skipping the (problem, strategy) runs it already holds; "
                        "the summary covers all of them")
    return p.parse_args()


def summarize(rows: list[dict], strategies: list[str]) -> dict:
    by = {s: {r["index"]: r for r in rows if r["strategy"] == s} for s in strategies}
    base = by.get("target-only", {})
    summary = {}
    for s in strategies:
        mine = list(by[s].values())
        ratios = [base[i]["seconds"] / r["seconds"] for i, r in by[s].items() if i in base and r["seconds"] > 0]
        accepted = [r["stats"]["step_acceptance_rate"] for r in mine if r["stats"]["step_acceptance_rate"] is not None]
        summary[s] = {
            "num_problems": len(mine),
            "accuracy": sum(r["correct"] for r in mine) / len(mine) if mine else None,
            "num_errors": sum(1 for r in mine if r["error"]),
            "median_seconds": statistics.median(r["seconds"] for r in mine) if mine else None,
            "total_seconds": sum(r["seconds"] for r in mine),
            "median_speedup": statistics.median(ratios) if ratios else None,
            "geomean_speedup": math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None,
            "mean_step_acceptance_rate": statistics.fmean(accepted) if accepted else None,
            "mean_target_token_share": statistics.fmean(r["stats"]["target_token_share"] or 0 for r in mine) if mine else None,
            "mean_trace_tokens": statistics.fmean(r["stats"]["num_tokens"] for r in mine) if mine else None,
        }
    return summary


def print_table(summary: dict) -> None:
    head = f"{'strategy':<14}{'acc':>6}{'median s':>10}{'speedup (median / geomean)':>28}{'step acc':>10}{'target share':>14}"
    print(head)
    print("-" * len(head))
    for s, m in summary.items():
        acc = f"{m['accuracy']:.0%}" if m["accuracy"] is not None else "-"
        speed = (f"{m['median_speedup']:.2f}x / {m['geomean_speedup']:.2f}x" if m["median_speedup"] else "-")
        step = f"{m['mean_step_acceptance_rate']:.2f}" if m["mean_step_acceptance_rate"] is not None else "-"
        share = f"{m['mean_target_token_share']:.2f}" if m["mean_target_token_share"] is not None else "-"
        print(f"{s:<14}{acc:>6}{m['median_seconds']:>10.1f}{speed:>28}{step:>10}{share:>14}")


async def main(args: argparse.Namespace) -> None:
    strategies = [s.strip() for s in args.strategies.split(",")]
    problems = load_problems("gsm8k", args.data_dir)[: args.limit]
    draft_path = resolve_model(args.draft)
    target = VLLMEngine(resolve_model(args.target), name="target", kv_cache_gib=args.kv_cache_gib,
                        speculative_config=speculative_config(args.target_spec, draft_model=draft_path))
    draft = VLLMEngine(draft_path, name="draft", kv_cache_gib=args.kv_cache_gib,
                       speculative_config=speculative_config(args.draft_spec))
    budget = Budget(max_tokens=args.max_tokens)
    options = {
        "target-only": {},
        "draft-only": {},
        "specreason": {"judge_options": {"threshold": args.threshold}},
        "lookahead": {"judge": args.lookahead_judge, "gamma": args.gamma},
        "spec-thinking": {},
    }
    reasoners = {s: Reasoner(target, draft, strategy=s, budget=budget, **options[s]) for s in strategies}
    t0 = time.perf_counter()
    await target.start()
    await draft.start()
    startup = time.perf_counter() - t0
    for r in reasoners.values():  # first-call costs (and the embedder's load) off the clock
        await r.asolve("What is 2 + 3?")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    samples_path = Path(args.resume) if args.resume else out / f"samples_{stamp}.jsonl"
    rows = [json.loads(line) for line in samples_path.open()] if args.resume else []
    done = {(r["index"], r["strategy"]) for r in rows}
    summarized = strategies + [s for s in dict.fromkeys(r["strategy"] for r in rows) if s not in strategies]
    print(f"engines started in {startup:.0f} s; {len(problems)} problems x {strategies}", flush=True)
    try:
        with samples_path.open("a") as samples:
            for i, p in enumerate(problems):
                reference = gsm8k_reference(p.reference)
                order = strategies[i % len(strategies):] + strategies[: i % len(strategies)]
                for s in order:
                    if (i, s) in done:
                        continue
                    await target.reset_prefix_cache()
                    await draft.reset_prefix_cache()
                    try:
                        trace = (await reasoners[s].asolve(p.question)).trace
                    except ReasoningError as e:
                        trace = e.trace
                    answer = trace_answer(trace)
                    row = {"index": i, "strategy": s, "answer": answer, "reference": reference,
                           "correct": answer == reference, "seconds": trace.seconds, "error": trace.error,
                           "stats": trace.stats(), "trace": json.loads(trace.to_json())}
                    rows.append(row)
                    samples.write(json.dumps(row) + "\n")
                    samples.flush()
                    print(f"[{i:>2}] {s:<13} {'ok ' if row['correct'] else 'bad'} {answer!s:>8} (ref {reference:>6}) "
                          f"{trace.seconds:6.1f} s  {trace.num_tokens:4d} tok  steps {len(trace.steps):2d}  "
                          f"accepted {trace.num_accepted_steps}/{trace.num_drafted_steps}", flush=True)
    finally:
        await target.close()
        await draft.close()
    summary = summarize(rows, summarized)
    results = {"settings": vars(args), "startup_seconds": startup, "summary": summary,
               "samples": str(samples_path)}
    (out / f"results_{stamp}.json").write_text(json.dumps(results, indent=2))
    print()
    print_table(summary)
    print(f"\nresults: {out / f'results_{stamp}.json'}\nsamples: {samples_path}")


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
