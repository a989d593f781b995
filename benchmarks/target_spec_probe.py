"""A choice probe, not a report: ``specreason`` with the target's token-level speculation
``draft`` (the 0.5B drafting its tokens inside the target) against ``suffix``, one problem at a
time, the two interleaved (alternating first), every engine's caches reset before each solve.

Problems GSM8K test 100 on (not the reported 0-99). One draft engine and both targets are
loaded together (about 20 GiB of a 23 GiB machine with 1.5 GiB KV caches). Each solve's
line: seconds, the phases (draft writing, verification, target writing) and the answer.

    python benchmarks/target_spec_probe.py [N] > benchmarks/measured/target_spec_gsm8k100-108_cpu/solves.jsonl
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys

from stepspec.engine.config import EnginePair, build_engines
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.reasoner import Reasoner
from stepspec.workflows.eval.datasets import load_dataset, select

METHODS = ("draft", "suffix")


async def main(num_problems: int) -> None:
    problems = select(load_dataset("gsm8k").problems, offset=100, limit=num_problems)
    pair = EnginePair(kv_cache_gib=1.5)
    configs = {**{f"target ({m})": pair.engines(m)[0] for m in METHODS}, "draft": pair.engines()[1]}
    built = build_engines(configs, names={role: c.model for role, c in configs.items()})
    arms = {m: Reasoner(built[f"target ({m})"], built["draft"], strategy="specreason", budget=Budget(max_tokens=640))
            for m in METHODS}
    try:
        for engine in built.values():
            await engine.start()
        for reasoner in arms.values():
            await reasoner.asolve("What is 2 + 3?")  # first-call costs off the clock
        rows = []
        for n, problem in enumerate(problems):
            row = {"doc_id": problem.index}
            for m in METHODS if n % 2 == 0 else METHODS[::-1]:
                for engine in built.values():
                    await engine.reset_caches()
                trace = (await arms[m].asolve(problem.question)).trace
                row[m] = {"seconds": trace.seconds, "answer": trace.answer,
                          "draft": round(sum(s.draft_seconds for s in trace.steps), 2),
                          "verify": round(sum(s.judge_seconds for s in trace.steps), 2),
                          "target": round(sum(s.target_seconds for s in trace.steps), 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        ratio = statistics.median(r["draft"]["seconds"] / r["suffix"]["seconds"] for r in rows)
        print(f"suffix against draft inside the target: {ratio:.2f}x median", file=sys.stderr)
    finally:
        for engine in built.values():
            await engine.close()


if __name__ == "__main__":  # vLLM spawns worker processes
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 12))
