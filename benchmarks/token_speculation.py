"""Target tokens/s with and without each token-level speculation method, one run.

Every method runs the same GSM8K prompts with greedy decoding, one sequence at a
time (the latency case that step-level strategies live in). Engines are started
one at a time (two 1.5B engines do not fit a 24 GiB machine together), in the
order: none, ngram, suffix, draft, none. Measuring the baseline both first and
last shows how much the machine drifted during the run; ratios use the mean of
the two baseline runs.

Also measured on the target alone: the cost of a one-token judge call (top-k
logprobs after a pre-filled ``Score:`` turn), cold and with its prefix cached.

    python benchmarks/token_speculation.py [--problems 3] [--max-tokens 128] [--json out.json]
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

from stepspec.engine.models import BUNDLED_DRAFT, BUNDLED_TARGET, resolve_model  # noqa: E402
from stepspec.engine.speculation import speculative_config, suffix_available  # noqa: E402
from stepspec.engine.types import GenerationRequest, Sampling  # noqa: E402
from stepspec.engine.vllm_backend import VLLMEngine  # noqa: E402
from stepspec.workflows.eval.datasets import load_problems  # noqa: E402
from stepspec.orchestrator.prompts import reasoning_messages  # noqa: E402
from stepspec.orchestrator.stepgen import opening_prompt as build_prompt  # noqa: E402

GiB = 2**30


async def run_method(method: str, target: str, draft: str, questions: list[str], max_tokens: int, k: int | None):
    config = speculative_config(method, draft_model=draft, num_speculative_tokens=k)
    engine = VLLMEngine(target, name=f"target[{method}]", max_model_len=4096, kv_cache_gib=1.0,
                        speculative_config=config)
    t0 = time.perf_counter()
    await engine.start()
    startup = time.perf_counter() - t0
    try:
        prompts = [await build_prompt(engine, q) for q in questions]
        # warm-up: one short generation so first-call costs do not land on problem 1
        await engine.generate([GenerationRequest(prompts[0], Sampling(max_tokens=8))])
        before = engine.stats().spec_decoding
        per_problem = []
        outputs = []
        for p in prompts:
            t = time.perf_counter()
            (r,) = await engine.generate([GenerationRequest(p, Sampling(max_tokens=max_tokens))])
            seconds = time.perf_counter() - t
            per_problem.append((r.completion.num_output_tokens, seconds))
            outputs.append(r.completion.token_ids)
        spec = engine.stats().spec_decoding.minus(before)
        peak = engine.stats().peak_rss_bytes
    finally:
        await engine.close()
    tokens = sum(n for n, _ in per_problem)
    seconds = sum(s for _, s in per_problem)
    return {
        "method": method,
        "speculative_config": config,
        "startup_seconds": startup,
        "num_output_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "per_problem_tokens_per_second": [n / s for n, s in per_problem],
        "acceptance_rate": spec.acceptance_rate,
        "mean_acceptance_length": spec.mean_acceptance_length,
        "num_drafts": spec.num_drafts,
        "peak_rss_gib": (peak or 0) / GiB,
        "outputs": outputs,
    }


async def judge_cost(target: str, question: str, reasoning_tokens: int):
    """Seconds for a one-token judge call: cold, then with the reasoning prefix cached."""
    engine = VLLMEngine(target, name="target[judge]", max_model_len=4096, kv_cache_gib=1.0)
    await engine.start()
    try:
        base = await build_prompt(engine, question)
        (r,) = await engine.generate([GenerationRequest(base, Sampling(max_tokens=reasoning_tokens))])
        reasoning = r.completion.text

        def judge_prompt(q: str) -> str:
            # question and reasoning so far, then the judge turn with "Score:" pre-filled
            return engine.apply_chat_template(
                [
                    *reasoning_messages(q),
                    {"role": "assistant", "content": reasoning},
                    {"role": "user", "content": "Rate the last step from 0 (wrong) to 9 (certainly right)."},
                    {"role": "assistant", "content": "Score:"},
                ],
                continue_final_message=True,
            )

        # cold: a question changed in its first words, so only the system prompt is cached
        t = time.perf_counter()
        (cold,) = await engine.next_token_logprobs([judge_prompt("Cold start. " + question)])
        cold_s = time.perf_counter() - t
        # cached: the reasoning the engine just wrote is in the prefix cache
        t = time.perf_counter()
        (warm,) = await engine.next_token_logprobs([judge_prompt(question)])
        warm_s = time.perf_counter() - t
        digits = {k: v for k, v in warm.by_text().items() if k.isdigit() and len(k) == 1}
    finally:
        await engine.close()
    return {
        "num_prompt_tokens_cold": cold.num_prompt_tokens,
        "num_cached_prompt_tokens_cold": cold.num_cached_prompt_tokens,
        "cold_seconds": cold_s,
        "num_prompt_tokens_cached": warm.num_prompt_tokens,
        "num_cached_prompt_tokens_cached": warm.num_cached_prompt_tokens,
        "cached_seconds": warm_s,
        "num_digit_tokens_in_top20": len(digits),
    }


async def main(args) -> dict:
    target = resolve_model(args.target)
    draft = resolve_model(args.draft)
    questions = [p.question for p in load_problems("gsm8k", args.data_dir)[: args.problems]]
    methods = ["none", "ngram"] + (["suffix"] if suffix_available() else []) + ["draft", "none"]
    runs = []
    for m in methods:
        print(f"running {m} ...", file=sys.stderr, flush=True)
        runs.append(await run_method(m, target, draft, questions, args.max_tokens, args.num_speculative_tokens))
    base_runs = [r for r in runs if r["method"] == "none"]
    base_tps = statistics.mean(r["tokens_per_second"] for r in base_runs)
    drift = base_runs[-1]["tokens_per_second"] / base_runs[0]["tokens_per_second"]
    judge = await judge_cost(target, questions[0], reasoning_tokens=args.judge_context_tokens)

    print(f"\nTarget {args.target}, {len(questions)} GSM8K problems, greedy, {args.max_tokens} max tokens, batch 1")
    print(f"{'method':<8} {'tok/s':>7} {'vs none':>8} {'accept':>7} {'mean len':>8} {'same output':>11} {'start s':>8} {'peak GiB':>8}")
    for r in runs:
        same = r["outputs"] == base_runs[0]["outputs"]
        acc = f"{r['acceptance_rate']:.3f}" if r["acceptance_rate"] is not None else "-"
        mal = f"{r['mean_acceptance_length']:.2f}" if r["mean_acceptance_length"] is not None else "-"
        print(f"{r['method']:<8} {r['tokens_per_second']:>7.2f} {r['tokens_per_second'] / base_tps:>7.2f}x "
              f"{acc:>7} {mal:>8} {str(same):>11} {r['startup_seconds']:>8.1f} {r['peak_rss_gib']:>8.2f}")
    print(f"baseline drift over the run (last none / first none): {drift:.3f}")
    print("\nOne-token judge call on the target (top-20 logprobs after 'Score:'):")
    print(f"  cold:   {judge['num_prompt_tokens_cold']} prompt tokens, "
          f"{judge['num_cached_prompt_tokens_cold']} cached, {judge['cold_seconds']:.2f} s")
    print(f"  cached: {judge['num_prompt_tokens_cached']} prompt tokens, "
          f"{judge['num_cached_prompt_tokens_cached']} cached, {judge['cached_seconds']:.2f} s")
    print(f"  digit tokens among the top 20: {judge['num_digit_tokens_in_top20']}")
    report = {"target": args.target, "draft": args.draft, "runs": runs, "baseline_drift": drift, "judge": judge}
    for r in report["runs"]:
        r.pop("outputs")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


def pair_arguments(doc: str, problems: int, max_tokens: int) -> argparse.ArgumentParser:
    """The options every pair benchmark takes: models, GSM8K problems, tokens, data, JSON out."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=BUNDLED_TARGET)
    parser.add_argument("--draft", default=BUNDLED_DRAFT)
    parser.add_argument("--problems", type=int, default=problems, help="the first N GSM8K test problems")
    parser.add_argument("--max-tokens", type=int, default=max_tokens)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--json", default=None, help="Also write the numbers to this JSON file.")
    return parser


if __name__ == "__main__":
    parser = pair_arguments(__doc__, problems=3, max_tokens=128)
    parser.add_argument("--num-speculative-tokens", type=int, default=None)
    parser.add_argument("--judge-context-tokens", type=int, default=300)
    asyncio.run(main(parser.parse_args()))
