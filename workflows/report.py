"""A benchmark run's metrics, table and report, computed from its files alone.

Terms (per strategy, over the run's problems):

* accuracy ± standard error: mean of 0/1 correctness; the error is the sample
  standard error sqrt(p(1-p)/(n-1)), as lm-evaluation-harness reports it.
* wall time p50/p90: seconds per problem, measured around each solve.
* output tokens/s: tokens of the final traces over the seconds spent on them.
* speedup over the baseline: per problem, baseline seconds / strategy seconds;
  the median and the geometric mean of those ratios. The baseline is
  ``target-only``, except for a search strategy whose target-only twin ran
  too (``PAIRED_BASELINES``: ``tree`` over ``tree-target``, ``best-of-n`` over
  ``best-of-n-target``: the same search, the target doing all of it).
* step acceptance rate: accepted drafted steps / drafted steps, pooled.
* target token share: tokens of the traces' text the target wrote / all of them.
* token-level acceptance (vLLM, per engine): accepted draft tokens / proposed
  draft tokens, and mean acceptance length = 1 + accepted / drafts (tokens per
  target forward pass). Example: 2 drafts of 3 tokens, 5 accepted: 0.83 and 3.5.
* orchestration share: (wall time − time with a model call in flight) / wall time,
  pooled: what stepspec itself costs around the models.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

PLOTS = ("accuracy_vs_speedup.png", "latency_cdf.png", "acceptance_by_position.png")
PAIRED_BASELINES = {"tree": "tree-target", "best-of-n": "best-of-n-target"}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize(records: dict[str, list[dict]], metrics: tuple[str, ...] | list[str],
              baseline: str | None = "target-only") -> dict[str, dict[str, Any]]:
    """Per strategy, the run's metrics from its sample records."""
    out = {}
    for strategy, rows in records.items():
        over = PAIRED_BASELINES.get(strategy) if PAIRED_BASELINES.get(strategy) in records else baseline
        base = {r["doc_id"]: r for r in records.get(over, [])} if over else {}
        n = len(rows)
        m: dict[str, Any] = {"num_problems": n, "num_errors": sum(1 for r in rows if r["error"])}
        m["accuracy"] = {k: statistics.fmean(r["correct"][k] for r in rows) if n else None for k in metrics}
        m["accuracy_stderr"] = {k: (math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else None) if (p := m["accuracy"][k])
                                is not None else None for k in metrics}
        seconds = [r["seconds"] for r in rows]
        m["seconds_p50"] = float(np.percentile(seconds, 50)) if n else None
        m["seconds_p90"] = float(np.percentile(seconds, 90)) if n else None
        m["seconds_total"] = sum(seconds)
        stats = [r["stats"] for r in rows]
        num_tokens = sum(s["num_tokens"] for s in stats)
        m["output_tokens_per_second"] = _ratio(num_tokens, sum(seconds))
        ratios = [base[r["doc_id"]]["seconds"] / r["seconds"] for r in rows
                  if r["doc_id"] in base and r["seconds"] > 0]
        m["speedup"] = {"median": statistics.median(ratios) if ratios else None,
                        "geomean": math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None,
                        "num_problems": len(ratios), "over": over if ratios else None}
        m["step_acceptance_rate"] = _ratio(sum(s["num_accepted_steps"] for s in stats),
                                           sum(s["num_drafted_steps"] for s in stats))
        m["target_token_share"] = _ratio(sum(s["num_target_tokens"] for s in stats), num_tokens)
        m["num_tokens_mean"] = num_tokens / n if n else None
        m["num_generated_tokens"] = {role: sum(s["num_generated_tokens"].get(role, 0) for s in stats)
                                     for role in sorted({k for s in stats for k in s["num_generated_tokens"]})}
        m["num_target_calls_mean"] = statistics.fmean(s["num_target_calls"] for s in stats) if n else None
        m["num_judge_calls_mean"] = statistics.fmean(s["num_judge_calls"] for s in stats) if n else None
        token_level = {}
        for role in sorted({k for s in stats for k in s["spec_decoding"]}):
            drafts = sum(s["spec_decoding"].get(role, {}).get("num_drafts", 0) for s in stats)
            proposed = sum(s["spec_decoding"].get(role, {}).get("num_draft_tokens", 0) for s in stats)
            accepted = sum(s["spec_decoding"].get(role, {}).get("num_accepted_tokens", 0) for s in stats)
            if drafts:
                token_level[role] = {"num_drafts": drafts, "num_draft_tokens": proposed,
                                     "num_accepted_tokens": accepted, "acceptance_rate": _ratio(accepted, proposed),
                                     "mean_acceptance_length": 1 + accepted / drafts}
        m["token_level"] = token_level
        model = sum(r["model_seconds"] for r in rows)
        m["orchestration_share"] = _ratio(sum(seconds) - model, sum(seconds))
        m["stop_reasons"] = dict(sorted(_count(r["stop_reason"] for r in rows).items()))
        out[strategy] = m
    return out


def _count(items) -> dict[str, int]:
    counts: dict[str, int] = {}
    for x in items:
        counts[x] = counts.get(x, 0) + 1
    return counts


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _share(x: float | None) -> str:
    """A small share with two significant digits (0.0017%, 1.2%)."""
    return "-" if x is None else f"{x * 100:.2g}%"


def table(summary: dict[str, dict[str, Any]], metrics: tuple[str, ...] | list[str]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the result table (shared by the terminal and report.md)."""
    primary, others = metrics[0], list(metrics[1:])
    header = (["strategy", "n", f"accuracy ({primary})"] + [f"acc ({k})" for k in others]
              + ["p50 s", "p90 s", "tok/s", "speedup median", "speedup geomean", "step acc", "target tok share",
                 "token acc (target)", "orchestration"])
    rows = []
    for strategy, m in summary.items():
        acc, se = m["accuracy"][primary], m["accuracy_stderr"][primary]
        target_tokens = m["token_level"].get("target")
        rows.append([
            strategy, str(m["num_problems"]),
            "-" if acc is None else f"{acc:.1%}" + ("" if se is None else f" ± {se:.1%}"),
            *[_fmt(m["accuracy"][k], ".1%") for k in others],
            _fmt(m["seconds_p50"], ".1f"), _fmt(m["seconds_p90"], ".1f"), _fmt(m["output_tokens_per_second"], ".2f"),
            _fmt(m["speedup"]["median"], ".2f", "×") + (f" (vs {m['speedup']['over']})" if m["speedup"].get("over")
                                                         not in (None, "target-only") else ""),
            _fmt(m["speedup"]["geomean"], ".2f", "×"),
            _fmt(m["step_acceptance_rate"], ".0%"), _fmt(m["target_token_share"], ".0%"),
            "-" if target_tokens is None else
            f"{target_tokens['acceptance_rate']:.2f} ({target_tokens['mean_acceptance_length']:.2f}/pass)",
            _share(m["orchestration_share"]),
        ])
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def load_run(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, list[dict]]]:
    """A run's results file and its sample records per strategy (in the run's problem order)."""
    from workflows.bench import find_results, read_samples

    run_dir = Path(run_dir)
    results = json.loads(find_results(run_dir).read_text())
    order = {doc: i for i, doc in enumerate(results["run"]["problem_ids"])}
    records = {}
    for strategy, name in results["run"]["samples"].items():
        rows = [r for r in read_samples(run_dir / name) if r["doc_id"] in order]
        records[strategy] = sorted(rows, key=lambda r: order[r["doc_id"]])
    return results, records


def acceptance_by_position(rows: list[dict]) -> list[tuple[int, int, int]]:
    """(step position, drafted steps, accepted) over a strategy's traces."""
    drafted: dict[int, int] = {}
    accepted: dict[int, int] = {}
    for r in rows:
        for step in r["trace"]["steps"]:
            if step["draft_text"] is not None:
                drafted[step["index"]] = drafted.get(step["index"], 0) + 1
                accepted[step["index"]] = accepted.get(step["index"], 0) + bool(step["accepted"])
    return [(i, drafted[i], accepted[i]) for i in sorted(drafted)]


def write_plots(run_dir: Path, summary: dict[str, dict[str, Any]], records: dict[str, list[dict]],
                metrics: list[str]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    primary = metrics[0]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for strategy, m in summary.items():
        x = m["speedup"]["geomean"] or (1.0 if m["num_problems"] else None)
        if x is None or m["accuracy"][primary] is None:
            continue
        ax.errorbar(x, m["accuracy"][primary], yerr=m["accuracy_stderr"][primary] or 0, fmt="o", capsize=4)
        ax.annotate(strategy, (x, m["accuracy"][primary]), textcoords="offset points", xytext=(6, 6))
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("speedup over target-only (geometric mean of per-problem ratios)")
    ax.set_ylabel(f"accuracy ({primary}) ± s.e.")
    ax.set_title("accuracy vs speedup")
    fig.tight_layout()
    fig.savefig(run_dir / PLOTS[0], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for strategy, rows in records.items():
        if rows:
            xs = sorted(r["seconds"] for r in rows)
            ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=strategy)
    ax.set_xlabel("wall time per problem (s)")
    ax.set_ylabel("fraction of problems")
    ax.set_title("latency CDF")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / PLOTS[1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for strategy, rows in records.items():
        points = acceptance_by_position(rows)
        if points:
            ax.plot([p for p, _, _ in points], [a / d for _, d, a in points], marker="o", label=strategy)
    ax.set_xlabel("step position in the trace")
    ax.set_ylabel("drafted steps accepted")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("step acceptance by position")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / PLOTS[2], dpi=120)
    plt.close(fig)
    return list(PLOTS)


def write_report(run_dir: str | Path) -> Path:
    """report.md and its plots, rebuilt from the run's results and samples files."""
    run_dir = Path(run_dir)
    results, records = load_run(run_dir)
    metrics = results["run"]["metrics"]
    summary = summarize(records, metrics, baseline=results.get("baseline"))
    header, rows = table(summary, metrics)
    plots = write_plots(run_dir, summary, records, metrics)
    config, run = results["config"], results["run"]
    sessions = run["sessions"]
    hw = sessions[-1]["hardware"] if sessions else {}
    versions = results.get("versions", {})
    lines = [
        f"# stepspec bench: {config['dataset']}, {', '.join(config['strategies'])}",
        "",
        f"Status: **{results['status']}**. {len(run['problem_ids'])} problems from `{run['dataset_source']}` "
        f"(offset {config['offset']}, limit {config['limit']}, sample {config['sample']}, seed {config['seed']}), "
        f"graded by `{run['grader']}`.",
        "",
        "All strategies ran in one process on the same engines and hardware, interleaved problem by problem "
        "(rotating order), prefix caches reset before every solve. Times are wall clock, measured.",
        "",
        markdown_table(header, rows),
        "",
        f"Models: target `{config['target']}` (token-level speculation: {config['target_spec']}), "
        f"draft `{config['draft']}` (token-level: {config['draft_spec']}). Budget: {config['max_tokens']} tokens, "
        f"{config['max_step_tokens']} per step, {config['max_steps']} steps.",
        f"Hardware: {hw.get('cpu_count')} CPUs ({hw.get('machine')}), GPU: {hw.get('gpu') or 'none'}. "
        f"Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v and k != "platform")
        + f". Git: `{results.get('git_hash')}`.",
        "",
        "Sessions (a resumed run has several): "
        + "; ".join(f"{s['started']}: {s['num_solved']} solves in "
                    f"{_fmt(s['seconds'], '.0f', ' s')} (engine start {_fmt(s['startup_seconds'], '.0f', ' s')})"
                    for s in sessions) + ".",
        "",
        "Speedup is per problem (target-only seconds / strategy seconds), then median and geometric mean. "
        "Orchestration is the share of wall time with no model call in flight.",
        "",
    ]
    over = results.get("overhead") or {}
    if over.get("run_share") is not None:
        lines += [f"Orchestration over the whole run: {_share(over['solve_share'])} of the solves' wall time; "
                  f"{_share(over['run_share'])} of the problem loop's {over['loop_seconds']:.0f} s, which also "
                  f"counts grading and writing samples (model calls: {over['model_seconds']:.0f} s, prefix-cache "
                  f"resets: {over['reset_seconds']:.1f} s).", ""]
    if run.get("skipped_lines"):
        lines += [f"Skipped malformed data lines: {', '.join(str(n) for n, _ in run['skipped_lines'])}.", ""]
    lines += [f"![{p}]({p})" for p in plots]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
