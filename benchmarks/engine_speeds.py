"""Each engine's speed per model x dtype x token-level method on this machine, one engine at a time.

``python benchmarks/engine_speeds.py --out benchmarks/measured/engines_cpu``. For every combination,
one engine is started alone (two 1.5B engines do not fit a 24 GiB machine together) and measured
greedy, batch 1:

* prefill: a prompt of about ``--prefill-tokens`` tokens (GSM8K questions in the reasoning
  chat), one output token, caches reset before each of 3 runs; tokens/s = prompt tokens /
  the median seconds.
* decode: each of the first ``--problems`` GSM8K problems in the reasoning chat, caches
  reset, the prompt prefilled by a one-token request first, then ``--max-tokens`` tokens
  timed; tokens/s = output tokens / seconds over the problems. With token-level
  speculation, its acceptance is read from vLLM's counters.

The results (with the CPU model, its bf16 flags, the dtype ``auto`` picks and why, and
the versions) go to ``--out`` as ``engines.json`` and ``report.md``; the bundled pair's
defaults (``stepspec.engine.config``) cite the committed run.

    python benchmarks/engine_speeds.py [--problems 3] [--max-tokens 200] [--out DIR]
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
from stepspec.engine.dtype import choose_dtype, cpu_info  # noqa: E402
from stepspec.engine.models import resolve_model  # noqa: E402
from stepspec.engine.speculation import speculative_config, suffix_available  # noqa: E402
from stepspec.engine.types import GenerationRequest, Sampling  # noqa: E402
from stepspec.engine.vllm_backend import VLLMEngine  # noqa: E402
from stepspec.orchestrator.stepgen import opening_prompt  # noqa: E402
from stepspec.workflows.eval.datasets import load_problems  # noqa: E402
from stepspec.workflows.eval.rundir import versions  # noqa: E402

GiB = 2**30
DTYPES = ("float32", "bfloat16")


def combinations(target: str, draft: str) -> list[tuple[str, str, str, str]]:
    """(role, model, dtype, method): the draft with none/ngram/suffix, the target with those and draft."""
    lookups = ["none", "ngram"] + (["suffix"] if suffix_available() else [])
    return ([("draft", draft, d, m) for d in DTYPES for m in lookups]
            + [("target", target, d, m) for d in DTYPES for m in [*lookups, "draft"]])


async def measure(role: str, model: str, dtype: str, method: str, drafter: str, questions: list[str],
                  max_tokens: int, prefill_tokens: int) -> dict:
    engine = VLLMEngine(model, name=f"{role}[{dtype},{method}]", dtype=dtype, max_model_len=4096,
                        kv_cache_gib=1.0, speculative_config=speculative_config(method, draft_model=drafter))
    t0 = time.perf_counter()
    await engine.start()
    startup = time.perf_counter() - t0
    try:
        prompts = [await opening_prompt(engine, q) for q in questions]
        await engine.generate([GenerationRequest(prompts[0], Sampling(max_tokens=8))])  # first-call costs
        long_prompt = ""
        for q in load_problems("gsm8k")[10:]:
            if engine.count_tokens(long_prompt) >= prefill_tokens:
                break
            long_prompt += q.question + "\n\n"
        long_prompt = await opening_prompt(engine, long_prompt)
        prefill = []
        for _ in range(3):
            await engine.reset_caches()
            t = time.perf_counter()
            (r,) = await engine.generate([GenerationRequest(long_prompt, Sampling(max_tokens=1))])
            prefill.append(time.perf_counter() - t)
        num_prefill = r.num_prompt_tokens
        before, tokens, seconds = engine.stats().spec_decoding, 0, 0.0
        for p in prompts:
            await engine.reset_caches()
            await engine.generate([GenerationRequest(p, Sampling(max_tokens=1))])  # the prompt, prefilled
            t = time.perf_counter()
            (r,) = await engine.generate([GenerationRequest(p, Sampling(max_tokens=max_tokens))])
            seconds += time.perf_counter() - t
            tokens += r.completion.num_output_tokens
        spec = engine.stats().spec_decoding.minus(before)
        peak = engine.stats().peak_rss_bytes
    finally:
        await engine.close()
    return {"role": role, "model": model, "dtype": dtype, "method": method, "startup_seconds": startup,
            "prefill_tokens": num_prefill, "prefill_seconds": statistics.median(prefill),
            "prefill_tokens_per_second": num_prefill / statistics.median(prefill),
            "decode_tokens": tokens, "decode_seconds": seconds, "decode_tokens_per_second": tokens / seconds,
            "acceptance_rate": spec.acceptance_rate, "mean_acceptance_length": spec.mean_acceptance_length,
            "peak_rss_gib": (peak or 0) / GiB}


def report(result: dict) -> str:
    cpu, machine = result["cpu"], result["machine"]
    lines = [f"# Engine speeds on {cpu['model']}", "",
             f"{machine['cpus']} CPUs; native bf16 flags: {', '.join(cpu['bf16_flags']) or 'none'}. "
             f"Greedy, batch 1, one engine at a time; decode: {result['max_tokens']} tokens on each of the first "
             f"{result['problems']} GSM8K problems (prompt prefilled first, caches reset per problem); prefill: "
             "one prompt, median of 3 cold runs. Versions: "
             + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v and k != "platform") + ".", "",
             "| model | dtype | token method | decode tok/s | accepted / drafted | prefill tok/s | start s | peak GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        lines.append(f"| {r['role']} {Path(r['model']).name} | {r['dtype']} | {r['method']} | "
                     f"{r['decode_tokens_per_second']:.1f} | {acc} | "
                     f"{r['prefill_tokens_per_second']:.0f} ({r['prefill_tokens']} tokens) | "
                     f"{r['startup_seconds']:.0f} | {r['peak_rss_gib']:.1f} |")
    lines += ["", "`dtype=auto` on this machine: "
              + "; ".join(f"{role}: {c['dtype']} ({c['reason']})" for role, c in result["auto"].items()) + "."]
    best = {}
    for r in result["runs"]:
        if r["role"] not in best or r["decode_tokens_per_second"] > best[r["role"]]["decode_tokens_per_second"]:
            best[r["role"]] = r
    lines += ["", "Fastest decode per role: " + "; ".join(
        f"{role} {r['dtype']} + {r['method']} ({r['decode_tokens_per_second']:.1f} tok/s)" for role, r in best.items())
        + "."]
    if "target" in best and "draft" in best:
        lines += ["", f"Draft/target cost gap at each one's fastest: "
                  f"{best['draft']['decode_tokens_per_second'] / best['target']['decode_tokens_per_second']:.2f}x."]
    return "\n".join(lines) + "\n"


async def main(args) -> dict:
    import os

    target, draft = resolve_model(args.target), resolve_model(args.draft)
    questions = [p.question for p in load_problems("gsm8k", args.data_dir)[: args.problems]]
    name, flags = cpu_info()
    runs = []
    for role, model, dtype, method in combinations(target, draft):
        if args.only and role not in args.only.split(","):
            continue
        print(f"{role} {dtype} {method} ...", file=sys.stderr, flush=True)
        runs.append(await measure(role, model, dtype, method, draft, questions, args.max_tokens,
                                  args.prefill_tokens))
        r = runs[-1]
        print(f"  decode {r['decode_tokens_per_second']:.1f} tok/s, prefill {r['prefill_tokens_per_second']:.0f} "
              f"tok/s, acceptance {r['acceptance_rate']}", file=sys.stderr, flush=True)
    result = {"cpu": {"model": name, "bf16_flags": list(flags)}, "machine": {"cpus": len(os.sched_getaffinity(0))},
              "problems": args.problems, "max_tokens": args.max_tokens, "versions": versions(),
              "auto": {role: choose_dtype("auto", m, cpu=True).to_dict() for role, m in (("draft", draft),
                                                                                       ("target", target))},
              "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engines.json").write_text(json.dumps(result, indent=2))
    (out / "report.md").write_text(report(result))
    print(report(result))
    return result


if __name__ == "__main__":
    parser = pair_arguments(__doc__, problems=3, max_tokens=200)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--only", default=None, help="draft, target or both (default both)")
    parser.add_argument("--out", default="benchmarks/measured/engines_cpu")
    asyncio.run(main(parser.parse_args()))
