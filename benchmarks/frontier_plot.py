"""The accuracy-vs-target-share frontier of committed bench runs: for every drafting arm in
each mode, the share of the problems solved against the share of the trace's tokens the
target wrote, with target-only at 100% (it writes everything) beside them. An arm up and to
the left of another solves as much with the target writing less: a moved frontier.

    python benchmarks/frontier_plot.py RUN_DIR [RUN_DIR ...] --out PNG

Each point is read from the run's results file (``results`` for latency mode,
``results_throughput`` for throughput mode); the numbers are printed as a table too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stepspec.workflows.eval.summary import MODES, recompute  # noqa: E402

MARKERS = {"throughput": "o", "latency": "^"}


def points(run_dir: Path) -> list[dict]:
    """(run, arm, mode, n, solved share, target token share) of every arm in both modes."""
    results, _, _ = recompute(run_dir)
    out = []
    for mode in reversed(MODES):  # latency, then throughput
        for arm, m in results.summary(mode).items():
            if m.num_problems and m.target_token_share is not None:
                out.append({"run": run_dir.name, "arm": arm, "mode": mode, "n": m.num_problems,
                            "accuracy": m.accuracy[results.primary], "target_share": m.target_token_share})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args()
    rows = [p for run in args.runs for p in points(run)]
    print("| run | arm | mode | n | solved | target token share |\n|---|---|---|---|---|---|")
    for p in rows:
        print(f"| {p['run']} | {p['arm']} | {p['mode']} | {p['n']} | {p['accuracy']:.1%} | {p['target_share']:.0%} |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    runs = list(dict.fromkeys(p["run"] for p in rows))
    for (run, mode) in dict.fromkeys((p["run"], p["mode"]) for p in rows):
        color = f"C{runs.index(run) % 10}"
        line = sorted((p for p in rows if (p["run"], p["mode"]) == (run, mode)), key=lambda p: p["target_share"])
        xs, ys = [100 * p["target_share"] for p in line], [100 * p["accuracy"] for p in line]
        ax.plot(xs, ys, marker=MARKERS[mode], color=color, alpha=0.8, label=f"{run} ({mode}, n={line[0]['n']})")
        for p, x, y in zip(line, xs, ys):
            ax.annotate(p["arm"], (x, y), textcoords="offset points", xytext=(5, 4 - 10 * runs.index(run)),
                        fontsize=7, color=color)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_xlabel("target's share of the trace's tokens (%)")
    ax.set_ylabel("problems solved (%)")
    ax.set_xlim(-5, 110)
    ax.set_title("accuracy against the target's share (o: under load, ^: one at a time)")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
