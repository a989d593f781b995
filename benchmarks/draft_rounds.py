"""A choice probe, not a report: would the draft stopping where its own confidence drops, or
writing two steps a call, pay?

Issue 78, levers 3 and 1: a quarter of the drafted tokens are thrown away after the verifier's cuts. A
draft that stopped before its first unsure token (its own logprob of the token below a threshold)
would not write, nor have verified, the tokens after a cut that follows that token; but every stop
that comes before the cut (or in a step the verifier accepts whole) costs one more round: a draft
call and a verification. This replays the drafted steps ``benchmarks/draft_confidence.py`` recorded
(each token's draft logprob, the verifier's cut) under each threshold and prices both sides with
the fitted costs of a call and a token (cost_model_cpu's report; override them on the command line).

Terms. A *round* is one draft call and the verification of what it wrote. A *stop* ends a round
before the first token whose draft logprob is below the threshold, after at least ``min_tokens``;
the target's token there is read from the verification (as at a cut), and the next round drafts on.
Worked example, threshold -1, min_tokens 4: a 40-token step whose token 12 has logprob -1.6 and
which the verifier cut at token 30 becomes two rounds (tokens 0-11, then 13-29 and the cut), the
tokens 31-39 never drafted: 9 x (draft + verification per token) saved against one call pair more.
Assumed: after a stop the draft writes on what it would have written (the target's token at the
stop is the draft's own, as it is where the verifier keeps the stop's token), and the verifier cuts
where it cut.

*Two steps a call*: the draft writes on past a step's end through the next, both verified in one
round. Where the first step is accepted whole the pair saves a round; where it is cut, the second
step's tokens are thrown away too and it is drafted again in a later round (its length stands in
for what the draft would have written past the cut step's end).

    python benchmarks/draft_rounds.py benchmarks/measured/draft_rounds_gsm8k100-129_cpu/steps.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

THRESHOLDS = (-0.25, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0)


def rounds(logprobs: list[float], kept: int, threshold: float, min_tokens: int) -> tuple[int, int]:
    """(rounds, tokens drafted) of one drafted step under the stop: up to the verifier's cut
    (``kept`` < len: the cut's token is the last drafted one) or the step's end."""
    end = min(kept + 1, len(logprobs))  # the cut token itself is drafted (and replaced by the target's)
    n_rounds, start = 1, 0
    while True:
        stop = next((i for i in range(start + min_tokens, len(logprobs)) if logprobs[i] < threshold), None)
        if stop is None or stop >= end:
            # the round runs to the step's end, or to a stop past the cut: drafted up to there
            return n_rounds, (len(logprobs) if stop is None else stop)
        n_rounds, start = n_rounds + 1, stop + 1  # the target's token at the stop, then the next round


def paired(steps: list[dict]) -> tuple[int, int]:
    """(rounds, tokens drafted) with the draft writing two steps a call, over one problem's ``steps``."""
    n_rounds = n_tokens = i = 0
    while i < len(steps):
        n = len(steps[i]["token_logprobs"])
        pair = steps[i + 1:i + 2]
        n_rounds, n_tokens = n_rounds + 1, n_tokens + n + sum(len(s["token_logprobs"]) for s in pair)
        i += 1 if pair and steps[i]["kept"] < n else 1 + len(pair)  # a cut first step: the second again
    return n_rounds, n_tokens


def totals(counts: list[tuple[int, int]]) -> tuple[int, int]:
    """(rounds, tokens drafted) summed over ``counts``, each a step's or a problem's."""
    return sum(r for r, _ in counts), sum(d for _, d in counts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("steps", type=Path)
    p.add_argument("--min-tokens", type=int, default=4)
    p.add_argument("--round", type=float, default=0.27 + 0.35, help="seconds of a draft call and a verification")
    p.add_argument("--token", type=float, default=0.030 + 0.0083, help="seconds of a drafted and verified token")
    a = p.parse_args()
    steps = [json.loads(line) for line in a.steps.read_text().splitlines() if line.strip()]
    steps = [s for s in steps if s.get("token_logprobs")]
    drafted = sum(len(s["token_logprobs"]) for s in steps)
    thrown = sum(len(s["token_logprobs"]) - s["kept"] for s in steps)
    base = len(steps) * a.round + drafted * a.token
    print(f"{len(steps)} drafted steps, {drafted} tokens drafted, {thrown} thrown away after cuts; "
          f"today {base:.0f} s of rounds and tokens")
    print("| threshold | rounds | tokens drafted | thrown away | seconds | saved |")
    print("|---|---|---|---|---|---|")
    for t in THRESHOLDS:
        n_rounds, n_tokens = totals([rounds(s["token_logprobs"], s["kept"], t, a.min_tokens) for s in steps])
        cost = n_rounds * a.round + n_tokens * a.token
        print(f"| {t} | {n_rounds} | {n_tokens} | {thrown - (drafted - n_tokens)} | {cost:.0f} | {base - cost:+.0f} s |")
    problems: dict[int, list[dict]] = {}
    for s in steps:
        problems.setdefault(s["doc_id"], []).append(s)
    n_rounds, n_tokens = totals([paired(one) for one in problems.values()])
    cost = n_rounds * a.round + n_tokens * a.token
    print(f"\ntwo steps a call: {n_rounds} rounds, {n_tokens} tokens drafted, {cost:.0f} s, saved {base - cost:+.0f} s")


if __name__ == "__main__":
    main()
