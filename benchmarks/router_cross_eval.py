"""Each router file on each verified collection: ROC-AUC of the verifier's cut label, and
what the router does at its own tau (share of steps it sends to the target, share of cut
steps it leaves with the draft).

A router's own collection is read on its held-out problems only (the split `stepspec router
train` made, from the seed and share in the router's metadata); another collection is read
whole, since the router never saw any of it.

    python benchmarks/router_cross_eval.py --router benchmarks/measured/router.pt \\
        --router benchmarks/measured/router_generated.pt \\
        --data benchmarks/measured/router_data_cpu --data benchmarks/measured/router_data_generated_cpu \\
        --json benchmarks/measured/router_cross_eval.json
"""

import argparse
import json
from pathlib import Path

from stepspec.routers.learned import LearnedRouter
from stepspec.routers.train import Label, labelled, labels, read_collection, roc_auc, routing_point, split_by_problem


def evaluate(router_path: str, data_dir: str) -> dict:
    router = LearnedRouter.load(router_path)
    meta = router.metadata
    examples = labelled(read_collection(data_dir)[0], Label.VERIFIER)
    own = Path(meta.get("source") or "").resolve() == Path(data_dir).resolve()
    if own:
        examples = split_by_problem(examples, meta["num_held_out_problems"] / meta["num_problems"], meta["seed"])[1]
    y = labels(examples, Label.VERIFIER, 0.0)
    p = [float(v) for v in router.predict([ex.state for ex in examples])]
    at_tau = routing_point([v >= router.tau for v in p], examples, router.tau)
    return {"router": router_path, "data": data_dir, "read": "held-out problems" if own else "all steps",
            "num_steps": len(y), "cut_share": sum(y) / len(y), "auc": roc_auc(y, p), "tau": router.tau,
            "to_target": at_tau.target_call_share, "target_token_share": at_tau.target_token_share,
            "missed_cuts": at_tau.missed_cut_share}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--router", action="append", required=True)
    ap.add_argument("--data", action="append", required=True)
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    rows = [evaluate(r, d) for r in args.router for d in args.data]
    for row in rows:
        print(f"{row['router']} on {row['data']} ({row['read']}, {row['num_steps']} steps, {row['cut_share']:.0%} cut): "
              f"AUC {row['auc']:.3f}; at tau {row['tau']:.3f}: {row['to_target']:.0%} of steps to the target "
              f"({row['target_token_share']:.0%} of tokens), {row['missed_cuts']:.0%} of cuts missed")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
