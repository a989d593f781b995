"""``stepspec bench``: arms side by side on a dataset's problems; ``bench report``, ``bench headline``,
``bench migrate`` and ``bench cost``."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from stepspec.common.options import checked
from stepspec.common.states import RunStatus
from stepspec.workflows.cli.common import (GAMMA, MAX_GAMMA, ROUTER, VERBOSE, app, console, opt, parse_opts,
                                  run_interruptible, setup_logging, strategy_flag, takes)
from stepspec.orchestrator.config import RunSettings
from stepspec.workflows.eval.bench import BenchSettings, load_bench_config
from stepspec.workflows.eval.results import Results, Sample

bench_app = typer.Typer(help="Strategies side by side on GSM8K, AIME, MATH-500 or your JSONL.")
app.add_typer(bench_app, name="bench")


# --opt values that switch an option off (a judge rule: --opt sr.judge.floor=none)
_NONE_VALUES = ("none", "null")


def strategy_options(strategies: list[str], threshold: Optional[float], gamma: Optional[int],
                      max_gamma: Optional[int], lookahead_judge: Optional[str], opts: list[str],
                      router: Optional[str] = None) -> dict:
    """Per-arm Reasoner keywords from the shortcut flags and --opt ARM.KEY=VALUE (KEY
    ``judge.NAME`` for a judge option, ``router.NAME`` for a router option, ``strategy``
    for the strategy of an arm whose label is not a strategy name, an engine setting such
    as ``target_spec`` for the arm's own engine). VALUE is JSON
    (``7``, ``-8.5``, ``true``), ``none``/``null`` for None, else a string."""
    options: dict[str, dict] = {}
    if router is not None:
        if "arbitrage" not in strategies:
            raise ValueError("--router drives the 'arbitrage' strategy, which is not in --strategies")
        options.setdefault("arbitrage", {})["router"] = router
    if threshold is not None and "specreason" in strategies:
        options.setdefault("specreason", {}).setdefault("judge_options", {})["threshold"] = threshold
    for key, value in (("gamma", gamma), ("max_gamma", max_gamma), ("judge", lookahead_judge)):
        if value is not None and "lookahead" in strategies:
            options.setdefault("lookahead", {})[key] = value
    for item in opts:
        target, sep, value = item.partition("=")
        strategy, dot, key = target.partition(".")
        if not sep or not dot or not key:
            raise ValueError(f"--opt wants STRATEGY.KEY=VALUE, got {item!r} (e.g. --opt specreason.first_target_steps=1)")
        if strategy not in strategies:
            raise ValueError(f"--opt {item!r}: strategy '{strategy}' is not in --strategies ({','.join(strategies)})")
        parsed = None if value.strip().lower() in _NONE_VALUES else parse_opts([f"{key}={value}"])[key]
        if key == "strategy" and not isinstance(parsed, str):
            raise ValueError(f"--opt {item!r}: the strategy of an arm is a strategy name")
        if key.startswith(("judge.", "router.")):
            kind, _, name = key.partition(".")
            options.setdefault(strategy, {}).setdefault(f"{kind}_options", {})[name] = parsed
        else:
            options.setdefault(strategy, {})[key] = parsed
    return options


_MODES = {"latency": ("latency",), "throughput": ("throughput",), "both": ("throughput", "latency")}
_MODE_NAMES = {modes: name for name, modes in _MODES.items()}


def _bench_modes(mode: str) -> tuple[str, ...]:
    if mode not in _MODES:
        raise ValueError(f"--mode is latency, throughput or both; got {mode!r}")
    return _MODES[mode]


class _LiveProgress:
    """A rich progress bar per arm and mode: problems done, running accuracy and step acceptance."""

    def __init__(self, progress) -> None:
        self.progress, self.metric = progress, ""
        self.tasks: dict[str, int] = {}
        self.seen: dict[str, list[Sample]] = {}

    def _describe(self, strategy: str) -> str:
        rows = self.seen[strategy]
        if not rows:
            return f"{strategy:<28}"
        acc = sum(r.is_correct(self.metric) for r in rows) / len(rows)
        drafted = sum(r.stats.num_drafted_steps for r in rows)
        accepted = sum(r.stats.num_accepted_steps for r in rows)
        steps = f"  steps accepted {accepted / drafted:.0%}" if drafted else ""
        return f"{strategy:<28} acc {acc:.0%}{steps}"

    def start(self, strategies, num_problems, done, metric) -> None:
        self.metric = metric
        for s in strategies:
            self.seen[s] = list(done[s])
            self.tasks[s] = self.progress.add_task(self._describe(s), total=num_problems, completed=len(done[s]))

    def sample(self, record) -> None:
        from stepspec.workflows.eval.bench_run import progress_key

        s = progress_key(record.strategy, record.mode)
        self.seen[s].append(record)
        self.progress.update(self.tasks[s], advance=1, description=self._describe(s))
        mark = "ok " if record.is_correct(self.metric) else "bad"
        self.progress.console.print(
            f"[dim]#{record.doc_id:<5}[/] {s:<28} {mark} {record.answer!s:>10} (gold {record.gold})  "
            f"{record.seconds:6.1f} s  {record.stats.num_tokens:5d} tok", highlight=False)


def _print_results(results: Results, run_dir: str) -> None:
    from stepspec.workflows.eval.report import comparison_table, table

    name = os.path.basename(results.config.dataset)
    shown = console if console.is_terminal else Console(width=200)  # a log file gets the whole table
    if results.results:
        header, rows = table(results.results, results.metrics)
        out = Table(*header, title=f"{name} (latency): {results.status}")
        for row in rows:
            out.add_row(*row)
        shown.print(out)
    header, rows = comparison_table(results)
    if rows:
        out = Table(*header, title=f"{name}: arms compared, {results.status}")
        for row in rows:
            out.add_row(*row)
        shown.print(out)
    console.print(f"run directory: {run_dir}  (report: {os.path.join(run_dir, 'report.md')})")
    if results.status == RunStatus.INCOMPLETE:  # this session ran some of the run's modes
        console.print(f"the run's other mode waits: `stepspec bench --resume {run_dir}`", highlight=False)


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave this parameter (not its default). Typer bundles its own click,
    whose ParameterSource enum it does not export: its member's name is compared."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


@bench_app.callback(invoke_without_command=True)
@takes(BenchSettings, "spec", skip=("strategy_options", "modes", "session_header"))
def bench(
    ctx: typer.Context,
    mode: str = opt(BenchSettings, "modes", "--mode", show=lambda modes: _MODE_NAMES[modes]),
    threshold: Optional[float] = strategy_flag("score judge", "threshold", more="For the specreason arm."),
    gamma: Optional[int] = GAMMA,
    max_gamma: Optional[int] = MAX_GAMMA,
    lookahead_judge: Optional[str] = typer.Option(None, help="lookahead: judge (default cascade)."),
    router: Optional[str] = ROUTER,
    opt: list[str] = typer.Option([], help="Any strategy option, STRATEGY.KEY=VALUE; judge and router options as "
                                   "STRATEGY.judge.KEY=VALUE, STRATEGY.router.KEY=VALUE; an arm's strategy as "
                                   "LABEL.strategy=NAME; VALUE none switches an option off (repeatable)."),
    max_num_seqs: int = opt(RunSettings, "max_num_seqs", more="Throughput mode raises it to the number of "
                             "problems (in-process engines; a server batches as it was started)."),
    output_dir: Optional[str] = typer.Option(None, help="Run directory (default runs/<dataset>-<time>)."),
    config: Optional[str] = typer.Option(None, help="A bench config file (YAML: the run's settings, flag names "
                                         "with underscores, and output_dir), instead of the flags."),
    resume: Optional[str] = typer.Option(None, help="Continue the run in this directory (its saved config is used; "
                                         "--mode runs only that of its modes in this session)."),
    progress: bool = typer.Option(True, help="Show the live progress bar."),
    verbose: int = VERBOSE,
    spec: dict[str, Any] = None,  # type: ignore[assignment]  # BenchSettings's flags (takes)
) -> None:
    """Run arms (strategies, or one strategy under several labels and options) side by side
    on the same problems, engines and hardware, in latency and/or throughput mode; write
    results_*.json, samples_*.jsonl and report.md. `stepspec bench report RUN_DIR` rebuilds the report."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from stepspec.workflows.eval.bench_run import run_bench
    from stepspec.workflows.serve.agent_workload import solve_agent_task

    setup_logging(verbose)
    session_modes = None
    if resume:
        run_dir, bench_spec = resume, _resumed(ctx, resume)
        if _on_command_line(ctx, "mode"):
            session_modes = _bench_modes(mode)
    elif config:
        _refuse_flags(ctx, f"--config {config} holds the run's settings", "drop them, or change the file",
                      allowed=("config", "output_dir", "progress", "verbose", "mode"))
        bench_spec, file_dir = load_bench_config(config)
        run_dir = output_dir or file_dir or _default_run_dir(bench_spec)
        resume = _started_from(bench_spec, run_dir, config)
        if _on_command_line(ctx, "mode"):
            if not resume:
                raise ValueError(f"--mode picks which of a started run's modes this session runs; {run_dir} holds "
                                 f"no run yet, so {config}'s modes decide: drop --mode, or change the file")
            session_modes = _bench_modes(mode)
    else:
        options = strategy_options(list(spec["strategies"]), threshold, gamma, max_gamma, lookahead_judge, opt, router)
        bench_spec = checked(BenchSettings, "bench", **spec, max_num_seqs=max_num_seqs, modes=_bench_modes(mode),
                             strategy_options=options)
        bench_spec.check()  # a bad arm or model fails here, before the progress bar starts
        run_dir = output_dir or _default_run_dir(bench_spec)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, disable=not progress)
    live = _LiveProgress(bar)
    with bar:
        # the results file is marked "interrupted" before the engines stop
        results = run_interruptible(lambda: run_bench(bench_spec, run_dir, resume=bool(resume), progress=live,
                                                      modes=session_modes, agent_solver=solve_agent_task),
                                    "every finished problem is saved; continue with "
                                    f"`stepspec bench --resume {run_dir}`")
    _print_results(results, run_dir)


def _started_from(spec: BenchSettings, run_dir: str, config: str) -> str | None:
    """``run_dir`` when it holds a run started with ``config``'s settings (the run resumes), None
    when it holds none; a run started with other settings is an error naming them."""
    from stepspec.workflows.eval.bench_run import saved_spec

    saved = saved_spec(run_dir)
    if saved is None:
        return None
    differ = sorted(k for k in spec.model_fields_set if getattr(saved, k) != getattr(spec, k))
    if differ:
        raise ValueError(f"{run_dir} holds a run started with other settings than {config} ({', '.join(differ)}); "
                         "give the file another output_dir, or resume that run with --resume")
    return run_dir


def _default_run_dir(spec: BenchSettings) -> str:
    return os.path.join("runs", f"{os.path.basename(spec.dataset).removesuffix('.jsonl')}-"
                        f"{time.strftime('%Y%m%d-%H%M%S')}")


def _refuse_flags(ctx: typer.Context, why: str, fix: str, allowed: tuple[str, ...]) -> None:
    """A flag that would be ignored (the settings come from elsewhere) is an error naming it."""
    given = sorted(p.opts[0] for p in ctx.command.params if p.name not in allowed and _on_command_line(ctx, p.name))
    if given:
        raise ValueError(f"{why}; {', '.join(given)} would change it: {fix}")


def _resumed(ctx: typer.Context, resume: str) -> BenchSettings:
    """A stand-in spec for a resumed run (the run's saved config replaces it); a flag that would
    change that config is an error, not ignored."""
    _refuse_flags(ctx, f"--resume {resume} runs with the run's saved config",
                  "drop them, or start a new run in another --output-dir (--mode may pick which of the run's modes "
                  "this session runs)", allowed=("resume", "mode", "progress", "verbose"))
    return BenchSettings()


@bench_app.command("report")
def bench_report(run_dir: str = typer.Argument(..., help="A run directory (holds results_*.json).")) -> None:
    """Rebuild report.md and the plots of a run from its files, and print its tables."""
    from stepspec.workflows.eval.report import write_report
    from stepspec.workflows.eval.summary import recompute

    path = write_report(run_dir)
    results, _, _ = recompute(run_dir)
    _print_results(results, run_dir)
    console.print(f"report: {path}")


@bench_app.command("headline")
def bench_headline(readme: str = typer.Argument("README.md", help="The file whose headline block to rebuild.")) -> None:
    """Rebuild the headline results table in README.md (between '<!-- headline: RUN_DIR ... -->' and
    '<!-- /headline -->') from the committed runs it names."""
    from stepspec.workflows.eval.report import update_headline

    changed = update_headline(readme)
    console.print(f"{readme}: headline table {'rebuilt' if changed else 'already current'}")


@bench_app.command("migrate")
def bench_migrate(
    runs: list[str] = typer.Argument(None, help="Run directories (each holding a results_*.json) to migrate."),
    record: list[str] = typer.Option([], "--record", help="A workflow run record (`stepspec run --record`) to "
                                     "migrate, to resume it; repeatable."),
) -> None:
    """Bring runs (and workflow run records) written in an older results schema to the one this
    stepspec reads, in place, once; a run already there is left as it is."""
    from pathlib import Path

    from stepspec.workflows.eval.migrate import migrate_record, migrate_run
    from stepspec.workflows.eval.results import SCHEMA_VERSION
    from stepspec.workflows.eval.rundir import BenchError

    if not runs and not record:
        console.print("[red]bench migrate: name a run directory or a --record file[/]")
        raise typer.Exit(2)
    done = f"at version {SCHEMA_VERSION} already"
    try:
        for path in record:
            console.print(f"{path}: {'migrated' if migrate_record(Path(path)) else done}")
        for run_dir in runs or []:
            console.print(f"{run_dir}: {'migrated' if migrate_run(Path(run_dir)) else done}")
    except (BenchError, OSError, ValueError) as e:
        console.print(f"[red]bench migrate: {e}[/]")
        raise typer.Exit(2) from e


@bench_app.command("cost")
def bench_cost(
    runs: list[str] = typer.Argument(..., help="Run directories to fit the costs on (their latency arms)."),
    check: list[str] = typer.Option([], "--check", help="A run directory to check the fitted model on "
                                    "(not fitted on it); repeatable."),
    baseline: str = typer.Option("target-only", help="The arm speedups are over."),
    arm: str = typer.Option("specreason", help="The arm of the cost-ratio table."),
    profiles: Optional[str] = typer.Option(None, help="A cost profiles YAML file (default: the published "
                                           "profiles that ship with stepspec)."),
    out: Optional[str] = typer.Option(None, help="Write the tables as markdown to this file too."),
) -> None:
    """Fit each engine operation's cost (per call, per prefilled and per decoded token) on runs'
    traces, check the fit on other runs, and price the traces on published GPU profiles and a grid
    of cost ratios: where step drafting pays."""
    from pathlib import Path

    from stepspec.workflows.eval.cost_report import CostRuns, cost_report, markdown
    from stepspec.workflows.eval.costmodel import CostModelError

    try:
        report = cost_report(CostRuns.read(runs, check), baseline=baseline, arm=arm, profiles_file=profiles)
    except (CostModelError, OSError) as e:
        console.print(f"[red]bench cost: {e}[/]")
        raise typer.Exit(2) from e
    shown = console if console.is_terminal else Console(width=250)
    for title, (header, rows) in report:
        table = Table(*header, title=title)
        for row in rows:
            table.add_row(*row)
        shown.print(table)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(markdown(report))
        console.print(f"written: {out}")
