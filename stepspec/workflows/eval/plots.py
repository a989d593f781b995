"""A run's plots: accuracy against speedup, the latency CDF, step acceptance by position."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stepspec.workflows.eval.results import Results
from stepspec.workflows.eval.summary import PLOTS, Records, acceptance_by_position


def write_plots(run_dir: Path, results: Results, latency: Records, throughput: Records) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    primary = results.primary
    lat, tp = results.summary("latency"), results.summary("throughput")
    colors = {arm: f"C{i % 10}" for i, arm in enumerate(results.config.strategies)}
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    drawn = set()
    for arm in results.config.strategies:
        points = []
        if arm in tp and tp[arm].throughput.speedup is not None:
            points.append((tp[arm], tp[arm].throughput.speedup, "o"))
        if arm in lat:
            m = lat[arm]
            points.append((m, m.speedup.geomean or (1.0 if m.num_problems else None), "^"))
        for m, x, marker in points:
            if x is None or m.accuracy[primary] is None:
                continue
            ax.errorbar(x, m.accuracy[primary], yerr=m.accuracy_stderr[primary] or 0, fmt=marker, capsize=4,
                        color=colors[arm])
            drawn.add(marker)
            ax.annotate(arm, (x, m.accuracy[primary]), textcoords="offset points", xytext=(6, 6), fontsize=8,
                        color=colors[arm])
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.margins(x=0.15, y=0.1)  # room for the labels
    ax.set_xlabel("speedup over target-only")
    ax.set_ylabel(f"accuracy ({primary}) ± s.e.")
    ax.set_title("accuracy vs speedup")
    legend = {"o": "throughput (wall time of all problems)", "^": "latency (geomean of per-problem ratios)"}
    if drawn:
        ax.legend(handles=[Line2D([], [], marker=k, ls="", color="k", label=v) for k, v in legend.items()
                           if k in drawn], fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(run_dir / PLOTS[0], dpi=120)
    plt.close(fig)

    # Per-problem latency: of the latency mode, or (a throughput-only run) under load.
    shown, where = (latency, "latency mode") if any(latency.values()) else (throughput, "throughput mode, under load")
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for arm, rows in shown.items():
        if rows:
            xs = sorted(r.seconds for r in rows)
            ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=arm, color=colors.get(arm))
    ax.set_xlabel("wall time per problem (s)")
    ax.set_ylabel("fraction of problems")
    ax.set_title(f"latency CDF ({where})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir / PLOTS[1], dpi=120)
    plt.close(fig)

    # Step acceptance: over all the problems (throughput) where that mode ran, else latency.
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for arm in results.config.strategies:
        points = acceptance_by_position(throughput.get(arm) or latency.get(arm) or [])
        if points:
            ax.plot([p for p, _, _ in points], [a / d for _, d, a in points], marker="o", label=arm,
                    color=colors[arm])
    ax.set_xlabel("step position in the trace")
    ax.set_ylabel("drafted steps accepted")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("step acceptance by position")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir / PLOTS[2], dpi=120)
    plt.close(fig)
    return list(PLOTS)

