"""``stepspec router``: the learned router (Arbitrage): collect steps, verify them, train, inspect."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from stepspec.routers.train import TrainSettings
from stepspec.common.options import checked
from stepspec.workflows.cli.common import (JUDGE_OPT, VERBOSE, app, console, parse_opts, run_interruptible, setup_logging,
                                  takes)
from stepspec.workflows.routing.collect import CollectSettings

router_app = typer.Typer(help="The learned router (Arbitrage): collect steps, train, inspect.", no_args_is_help=True)
app.add_typer(router_app, name="router")


@router_app.command("collect")
@takes(CollectSettings, "spec", skip=("judge_options", "num_speculative_tokens", "timeout", "target_url", "draft_url",
                                  "api_key_env", "max_num_seqs", "session_header"))
def router_collect(
    judge_opt: list[str] = JUDGE_OPT,
    concurrency: int = typer.Option(8, help="Problems in flight at once (the engines batch their steps)."),
    overlap: bool = typer.Option(False, help="Let both engines compute at once (default: they take turns, much "
                                 "faster when they share CPU cores)."),
    output_dir: str = typer.Option("runs/router-data", help="Collection directory (run again to continue it)."),
    verbose: int = VERBOSE,
    spec: dict[str, Any] = None,  # type: ignore[assignment]  # CollectSettings's flags (takes)
) -> None:
    """Solve training problems with both models at every step and record both candidate steps,
    their ratings and the draft's token logprobs (append-only; run again to resume)."""
    from stepspec.workflows.routing.collect import collect

    setup_logging(verbose)
    collect_spec = checked(CollectSettings, "router collect", **spec, judge_options=parse_opts(judge_opt))

    def show(record: dict) -> None:
        mark = "ok " if record["correct"] else "bad"
        console.print(f"[dim]{record['problem_id']:<22}[/] {mark} {record['num_steps']:3d} steps, target better at "
                      f"{record['num_target_won']:3d}  {record['seconds']:6.1f} s", highlight=False)

    result = run_interruptible(lambda: collect(collect_spec, output_dir, concurrency=concurrency, overlap=overlap,
                                               on_problem=show),
                               "every collected step is saved; run the same command again to continue")
    console.print_json(json.dumps(result))


@router_app.command("verify")
def router_verify(
    data_dir: str = typer.Argument(..., help="A collection directory (holds examples.jsonl)."),
    judge_opt: list[str] = typer.Option([], help="Any likelihood judge option, key=value (repeatable); default: "
                                        "the typed rules specreason uses."),
    batch_size: int = typer.Option(32, help="Steps the target scores per batch."),
    verbose: int = VERBOSE,
) -> None:
    """Score every collected drafted step with the target's likelihood verifier (one prefill
    each) and record whether it cuts the step: the router's default label (verdicts.jsonl;
    run again to go on where it stopped)."""
    from stepspec.workflows.routing.verify import verify_collection

    setup_logging(verbose)

    def show(done: int, total: int) -> None:
        console.print(f"[dim]verified {done} of {total} steps[/]", highlight=False)

    result = run_interruptible(lambda: verify_collection(data_dir, judge_options=parse_opts(judge_opt),
                                                         batch_size=batch_size, on_batch=show),
                               "every verdict so far is saved; run the same command again to go on")
    console.print_json(json.dumps(result))


@router_app.command("train")
@takes(TrainSettings, "settings")
def router_train(
    data_dir: str = typer.Argument(..., help="A collection directory (holds examples.jsonl)."),
    out: str = typer.Option("runs/router.pt", help="Router file to write."),
    settings: dict[str, Any] = None,  # type: ignore[assignment]  # TrainSettings' flags (takes)
) -> None:
    """Train the router on collected steps, report held-out ROC-AUC and the routing curve,
    choose tau for the goal, and save one router file."""
    from pathlib import Path

    from stepspec.routers.train import Label, read_collection, train_router

    if settings["label"] is Label.ADVANTAGE and settings["target_budget"] is None and settings["tau"] is None:
        settings["match_specreason"] = True
    examples, dropped = read_collection(Path(data_dir))
    report = train_router(examples, checked(TrainSettings, "router train", **settings), source=str(data_dir))
    path = report.router.save(out)
    _print_router(report.metrics, report.curve)
    if dropped:
        console.print(f"[dim]{dropped} cut-off line left out of {data_dir}/examples.jsonl[/]")
    console.print(f"router saved: {path}")


@router_app.command("info")
def router_info(path: str = typer.Argument(..., help="A router file.")) -> None:
    """What a router file holds: features, tau and its training metrics."""
    from stepspec.routers.learned import LearnedRouter

    router = LearnedRouter.load(path)
    console.print(f"{path}: feature set v{router.feature_set.version} ({len(router.feature_set.names)} features, "
                  f"embedding {'on' if router.feature_set.embedding else 'off'}), "
                  f"{'logistic regression' if router.hidden == 0 else f'MLP, {router.hidden} hidden'}, "
                  f"tau {router.tau:.3f}", highlight=False)
    _print_router(router.metadata, [])


def _print_router(m: dict, curve: list) -> None:
    def pct(x):
        return "-" if x is None else f"{x:.0%}"

    def num(x, f=".3f"):
        return "-" if x is None else format(x, f)

    label = m.get("label", "advantage")
    what = "the verifier cut the drafted step" if label == "verifier" else f"target better by > {m['margin']}"
    console.print(f"steps: {m['num_train']} train ({m['num_train_problems']} problems), {m['num_held_out']} held out "
                  f"({m['num_held_out_problems']} problems), {m.get('num_unlabelled', 0)} without the label's data "
                  f"left out; label '{what}': {pct(m['positive_share_train'])} of train, "
                  f"{pct(m['positive_share_held_out'])} held out", highlight=False)
    console.print(f"ROC-AUC: held out {num(m['auc_held_out'])}, train {num(m['auc_train'])}", highlight=False)
    columns = ("target calls", "target tokens", "missed cuts", "mean step rating")
    table = Table("policy (held out)", *columns,
                  title=f"tau {m['tau']:.4g} for {m['goal']}: goal {'met' if m['goal_met'] else 'NOT met'}")
    rows = {"router at tau": m["held_out_at_tau"], **m["held_out_references"]}
    for name, p in rows.items():
        table.add_row(name, pct(p["target_call_share"]), pct(p["target_token_share"]), pct(p.get("missed_cut_share")),
                      num(p["mean_quality"], ".2f"))
    console.print(table)
    if curve:
        step = max(1, len(curve) // 12)
        c = Table("tau", *columns, title="held-out routing curve")
        shown = curve[::step] if (len(curve) - 1) % step == 0 else [*curve[::step], curve[-1]]
        for point in shown:
            c.add_row(f"{point.tau:.4g}", pct(point.target_call_share), pct(point.target_token_share),
                      pct(point.missed_cut_share), num(point.mean_quality, ".2f"))
        console.print(c)
