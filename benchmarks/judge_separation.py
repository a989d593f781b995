"""Does the judge's score tell right steps from wrong ones? Read from a step benchmark's samples.

Only steps the ``score`` judge decided count (a cascade's other rungs score on
other scales). The cleanest label a GSM8K run has is the final step: the one holding the
answer is right or wrong. For every judged final step of ``--strategy``, this
prints the judge's scores for right and wrong answers, the AUC (the chance that
a right final step outscores a wrong one; 0.5 is no signal) and, per
threshold, the share of right and of wrong final steps that would be accepted.

    python benchmarks/judge_separation.py runs/RUN/samples_gsm8k_specreason.jsonl

(any samples file of ``stepspec bench``; correctness is the grader's primary metric).

``--rescore``: start the target and score the final step of every trace in
the file (any strategy: target-only traces give right and wrong final steps
too) with the default rubric and each ``--rubric``, to compare prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def is_correct(row: dict) -> bool:
    """A sample's correctness under its grader's primary (first) metric."""
    return bool(next(iter(row["correct"].values())))


def auc(positive: list[float], negative: list[float]) -> float | None:
    if not positive or not negative:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


async def rescore(samples: str, rubrics: list[str], target: str) -> None:
    from stepspec.engine.models import resolve_model
    from stepspec.engine.vllm_backend import VLLMEngine
    from stepspec.judges.base import StepCandidate
    from stepspec.judges.score import DEFAULT_RUBRIC, ScoreJudge
    from stepspec.orchestrator.prompts import opening_messages

    finals = []  # (correct, candidate)
    with open(samples) as f:
        for line in f:
            row = json.loads(line)
            steps = [s["text"] for s in row["trace"]["steps"]]
            at = [i for i, t in enumerate(steps) if "\\boxed" in t]
            if at:
                q = row["trace"]["question"]
                finals.append((is_correct(row), StepCandidate(q, tuple(steps[:at[-1]]), steps[at[-1]],
                                                             opening_messages=opening_messages(q))))
    engine = VLLMEngine(resolve_model(target), name="target", kv_cache_gib=1.0)
    await engine.start()
    try:
        for rubric in [DEFAULT_RUBRIC, *rubrics]:
            verdicts = await ScoreJudge(engine, rubric=rubric).judge([c for _, c in finals])
            right = [v.score for (ok, _), v in zip(finals, verdicts) if ok and v.score is not None]
            wrong = [v.score for (ok, _), v in zip(finals, verdicts) if not ok and v.score is not None]
            a = auc(right, wrong)
            print(f"rubric {rubric[:70]!r}...: {len(right)} right (median {statistics.median(right):.2f}), "
                  f"{len(wrong)} wrong (median {statistics.median(wrong):.2f}), AUC {a:.2f}", flush=True)
    finally:
        await engine.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("samples")
    p.add_argument("--strategy", default="specreason")
    p.add_argument("--rescore", action="store_true", help="score every final step again with the target")
    p.add_argument("--rubric", action="append", default=[], help="another rubric to compare (with --rescore)")
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    args = p.parse_args()
    if args.rescore:
        asyncio.run(rescore(args.samples, args.rubric, args.target))
        return
    right, wrong, every = [], [], []
    with open(args.samples) as f:
        for line in f:
            row = json.loads(line)
            if row["strategy"] != args.strategy:
                continue
            judged = [s for s in row["trace"]["steps"] if s["judge"] == "score" and s["score"] is not None]
            every.extend(s["score"] for s in judged)
            final = [s for s in judged if "\\boxed" in (s["draft_text"] or "")]
            if final:
                (right if is_correct(row) else wrong).append(final[-1]["score"])
    if not every:
        raise SystemExit(f"no judged steps of strategy '{args.strategy}' in {args.samples}")
    print(f"{len(every)} judged steps: score median {statistics.median(every):.2f}, "
          f"range {min(every):.2f}-{max(every):.2f}")
    print(f"final steps: {len(right)} right (median {statistics.median(right) if right else float('nan'):.2f}), "
          f"{len(wrong)} wrong (median {statistics.median(wrong) if wrong else float('nan'):.2f}); "
          f"AUC {auc(right, wrong) if auc(right, wrong) is not None else float('nan'):.2f}")
    print(f"{'threshold':>10}{'right kept':>12}{'wrong kept':>12}")
    for t in (6.0, 7.0, 7.5, 8.0, 8.25, 8.5, 8.75, 9.0):
        kept_right = sum(s >= t for s in right) / len(right) if right else float("nan")
        kept_wrong = sum(s >= t for s in wrong) / len(wrong) if wrong else float("nan")
        print(f"{t:>10.2f}{kept_right:>12.2f}{kept_wrong:>12.2f}")


if __name__ == "__main__":
    main()
