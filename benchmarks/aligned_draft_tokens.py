"""Token level: the target with a draft model drafting its tokens (`--spec draft`), the
unaligned draft against the aligned one, in one run.

Each engine is the target with one draft inside (started one at a time: two do not fit in
memory together), greedy, batch 1, the same GSM8K prompts (problems other than the bench's
reported 0-99 by default), in the order unaligned, aligned, unaligned: the two unaligned runs
show how much the machine drifted. Reported: the draft's token acceptance, tokens per target
pass, decode speed, and whether the output is the target's own (it must be: greedy
speculation is lossless).

    python benchmarks/aligned_draft_tokens.py --aligned qwen2.5-coder-0.5b-aligned --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stepspec.engine.dtype import cpu_info  # noqa: E402
from stepspec.engine.models import BUNDLED_DRAFT, BUNDLED_TARGET, resolve_model  # noqa: E402
from token_speculation import run_method  # noqa: E402
from stepspec.workflows.eval.datasets import load_problems  # noqa: E402


def report(result: dict) -> str:
    runs = result["runs"]
    lines = [f"# Token level: the target ({result['target']}) with each draft inside", "",
             f"CPU: {result['cpu']}. GSM8K {result['offset']}-{result['offset'] + result['problems'] - 1}, greedy, "
             f"batch 1, {result['max_tokens']} tokens each, `num_speculative_tokens` "
             f"{result['num_speculative_tokens'] or 'default'}; one engine at a time, in this order.", "",
             "| draft inside the target | acceptance | tokens per pass | tok/s | same output as the first run |",
             "|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['draft']} | {r['acceptance_rate']:.3f} | {r['mean_acceptance_length']:.2f} | "
                     f"{r['tokens_per_second']:.2f} | {r['same_output']} |")
    first, aligned, last = runs
    lines += ["", f"Drift (the unaligned draft's last run over its first): "
              f"{last['tokens_per_second'] / first['tokens_per_second']:.3f}x tok/s. Aligned against the mean of the "
              f"unaligned runs: acceptance {aligned['acceptance_rate'] / ((first['acceptance_rate'] + last['acceptance_rate']) / 2):.2f}x, "
              f"tok/s {aligned['tokens_per_second'] / ((first['tokens_per_second'] + last['tokens_per_second']) / 2):.2f}x."]
    return "\n".join(lines) + "\n"


async def main(args) -> None:
    target = resolve_model(args.target)
    drafts = {args.draft: resolve_model(args.draft), args.aligned: resolve_model(args.aligned)}
    problems = load_problems("gsm8k", args.data_dir)[args.offset:args.offset + args.problems]
    questions = [p.question for p in problems]
    runs = []
    for name in (args.draft, args.aligned, args.draft):
        print(f"target with {name} inside ...", file=sys.stderr, flush=True)
        run = await run_method("draft", target, drafts[name], questions, args.max_tokens, args.num_speculative_tokens)
        run["draft"] = name
        runs.append(run)
    for run in runs:
        run["same_output"] = run["outputs"] == runs[0]["outputs"]
    for run in runs:
        run.pop("outputs")
    result = {"cpu": cpu_info()[0], "target": args.target, "offset": args.offset, "problems": args.problems,
              "max_tokens": args.max_tokens, "num_speculative_tokens": args.num_speculative_tokens, "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokens.json").write_text(json.dumps(result, indent=1))
    (out / "tokens.md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=BUNDLED_TARGET)
    parser.add_argument("--draft", default=BUNDLED_DRAFT)
    parser.add_argument("--aligned", default=f"{BUNDLED_DRAFT}-aligned")
    parser.add_argument("--offset", type=int, default=100, help="first GSM8K problem (default: past the reported 0-99)")
    parser.add_argument("--problems", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--num-speculative-tokens", type=int, default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="benchmarks/measured/align_qwen2.5-coder-0.5b_cpu")
    asyncio.run(main(parser.parse_args()))
