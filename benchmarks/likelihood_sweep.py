"""Choose the likelihood judge's defaults on GSM8K test problems 100-129, not the bench's 0-99.

Each arm solves all 30 problems at once on the bundled pair (greedy, no token-level
speculation, no goodput backoff, 640-token budget) and appends one JSON line to the
output file: wall time, problems solved and which, the target's share of the traces'
tokens, cut steps. Run one arm after another (two cores):

    python benchmarks/likelihood_sweep.py OUT.jsonl target-only,typed-5,typed-3

Results: benchmarks/measured/likelihood_defaults_gsm8k100-129/arms.jsonl (target-only
19/30; typed-5 17; typed-3 17; typed-5-contrast4 17; typed-5-plan2, the target writing
the first two steps, 19: specreason's default first_target_steps=2 comes from it).
Each arm sets first_target_steps itself, so the rows keep their meaning when the
strategy's default changes.
"""
import asyncio
import json
import sys
import time

from stepspec.engine.config import EnginePair, build_engines
from stepspec.orchestrator.reasoner import Reasoner
from stepspec.orchestrator.budget import Budget
from stepspec.workflows.eval.datasets import load_dataset
from stepspec.workflows.eval.graders import get_grader

ARMS = {
    "target-only": dict(strategy="target-only"),
    "typed-5": dict(strategy="specreason", judge="likelihood", judge_options=dict(floor=-5.0, math_max_rank=1), backoff=False, first_target_steps=0),
    "typed-3": dict(strategy="specreason", judge="likelihood", judge_options=dict(floor=-3.0, math_max_rank=1), backoff=False, first_target_steps=0),
    "typed-2": dict(strategy="specreason", judge="likelihood", judge_options=dict(floor=-2.0, math_max_rank=1), backoff=False, first_target_steps=0),
    "typed-5-plan2": dict(strategy="specreason", judge="likelihood", judge_options=dict(floor=-5.0, math_max_rank=1),
                          first_target_steps=2, backoff=False),
    "typed-5-contrast4": dict(strategy="specreason", judge="likelihood",
                              judge_options=dict(floor=-5.0, math_max_rank=1, contrast=-4.0), backoff=False,
                              first_target_steps=0),
    "score": dict(strategy="specreason", judge="score", backoff=False, first_target_steps=0),
    "rank2-math1": dict(strategy="specreason", judge="likelihood", judge_options=dict(floor=None, max_rank=2, math_max_rank=1), backoff=False, first_target_steps=0),
}

async def main(out):
    data = load_dataset("gsm8k")
    grader = get_grader(data.grader)
    probs = data.problems[100:130]
    pair = EnginePair(target_spec="none", kv_cache_gib=2.0, max_model_len=4096, max_num_seqs=32)  # the bundled pair
    target, draft = build_engines(dict(zip(("target", "draft"), pair.engines()))).values()
    await target.start(); await draft.start()
    budget = Budget(max_tokens=640)
    for name in sys.argv[2].split(","):
        await target.reset_caches(); await draft.reset_caches()
        r = Reasoner(target, draft, budget=budget, max_concurrency=len(probs), **ARMS[name])
        t = time.perf_counter()
        sols = await r.asolve_many([p.question for p in probs])
        wall = time.perf_counter() - t
        correct = [grader.grade(s.trace.text, p.reference)[grader.metrics[0]].correct for s, p in zip(sols, probs)]
        tt = sum(s.trace.num_target_tokens for s in sols); nt = sum(s.trace.num_tokens for s in sols)
        row = dict(arm=name, wall=wall, solved=sum(correct), correct=correct, target_share=tt/nt,
                   cut_steps=sum(s.trace.num_cut_steps for s in sols), steps=sum(len(s.trace.steps) for s in sols))
        print(json.dumps(row), flush=True)
        with open(out, "a") as f: f.write(json.dumps(row) + "\n")
    await target.close(); await draft.close()

if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
