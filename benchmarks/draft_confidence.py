"""A choice probe, not a report: how sure the draft was of each step it drafted, against what the
likelihood verifier then decided, to choose specreason's ``confident_logprob`` (the confidence gate).

specreason (the defaults) solves GSM8K test problems 100 on (the choosing set, not the reported
0-99), one at a time; every drafted step's verification is recorded with the draft's own lowest
token logprob in the step. For each candidate threshold: the share of drafted steps at or above it
(they would skip the check) and the share of those the verifier accepted whole.

    python benchmarks/draft_confidence.py 20 benchmarks/measured/confidence_gsm8k100_cpu/steps.jsonl

Each line also holds every drafted token's logprob under the draft (``token_logprobs``), for a
stop where the draft's confidence drops (``benchmarks/draft_rounds.py`` replays the lines).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stepspec.engine.config import EnginePair, build_engines  # noqa: E402
from stepspec.judges.likelihood import LikelihoodJudge  # noqa: E402
from stepspec.orchestrator.budget import Budget  # noqa: E402
from stepspec.orchestrator.reasoner import Reasoner  # noqa: E402
from stepspec.workflows.eval.datasets import load_dataset, select  # noqa: E402

THRESHOLDS = (-0.1, -0.25, -0.5, -1.0, -1.5, -2.0, -3.0)


async def main(num_problems: int, out: Path) -> None:
    steps: list[dict] = []
    judge = LikelihoodJudge.judge

    async def recording(self, candidates):
        verdicts = await judge(self, candidates)
        for c, v in zip(candidates, verdicts):
            steps.append({"min_logprob": min(c.draft_token_logprobs, default=0.0), "tokens": len(c.draft_token_ids),
                          "accepted": v.accept, "kept": v.cut.offset if v.cut else len(c.draft_token_ids),
                          "token_logprobs": [round(x, 4) for x in c.draft_token_logprobs]})
        return verdicts

    LikelihoodJudge.judge = recording
    target, draft = EnginePair().engines(auto_target_spec="suffix")
    built = build_engines({"target": target, "draft": draft})
    reasoner = Reasoner(built["target"], built["draft"], strategy="specreason", budget=Budget(max_tokens=640))
    try:
        for problem in select(load_dataset("gsm8k").problems, offset=100, limit=num_problems):
            start = len(steps)
            trace = (await reasoner.asolve(problem.question)).trace
            with out.open("a") as f:
                f.writelines(json.dumps({"doc_id": problem.index, **s}) + "\n" for s in steps[start:])
            print(f"#{problem.index}: {len(steps) - start} drafted steps, answer {trace.answer}", file=sys.stderr)
    finally:
        for engine in built.values():
            await engine.close()
    for t in THRESHOLDS:
        gated = [s for s in steps if s["min_logprob"] >= t]
        accepted = sum(s["accepted"] for s in gated)
        print(f"confident_logprob {t}: {len(gated)}/{len(steps)} drafted steps unchecked, "
              f"{accepted}/{len(gated) or 1} of them accepted by the verifier", file=sys.stderr)


if __name__ == "__main__":  # vLLM spawns worker processes
    asyncio.run(main(int(sys.argv[1]), Path(sys.argv[2])))
