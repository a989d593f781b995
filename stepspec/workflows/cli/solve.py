"""``stepspec solve``: one question, its trace streamed step by step."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Optional

import typer
from rich.table import Table

from stepspec.common.states import Author
from stepspec.orchestrator.config import RunSettings
from stepspec.common.options import checked
from stepspec.workflows.cli.common import (GAMMA, JUDGE, JUDGE_OPT, MAX_GAMMA, ROUTER, ROUTER_OPT, STRATEGY, VERBOSE, app,
                                  console, err_console, parse_opts, setup_logging, strategy_flag, takes)
from stepspec.workflows.cli.progress import engine_progress, prepare_progress
from stepspec.workflows.eval.datasets import DatasetError


@app.command()
@takes(RunSettings, "run", skip=("max_num_seqs", "session_header"))
def solve(
    question: Optional[str] = typer.Argument(None, help="The question (default: one from --dataset)."),
    strategy: str = STRATEGY,
    judge: Optional[str] = JUDGE,
    threshold: Optional[float] = strategy_flag("score judge", "threshold"),
    score_method: Optional[str] = strategy_flag("score judge", "method", "--score-method"),
    judge_opt: list[str] = JUDGE_OPT,
    router: Optional[str] = ROUTER,
    router_opt: list[str] = ROUTER_OPT,
    first_target_steps: Optional[int] = strategy_flag("specreason", "first_target_steps"),
    gamma: Optional[int] = GAMMA,
    max_gamma: Optional[int] = MAX_GAMMA,
    cues: Optional[str] = strategy_flag("spec-thinking", "cues", more="Comma-separated."),
    takeover_tokens: Optional[int] = strategy_flag("spec-thinking", "takeover_tokens"),
    dataset: str = typer.Option("gsm8k", help="Dataset to take the question from."),
    index: int = typer.Option(0, help="Which problem of the dataset (0-based)."),
    data_dir: Optional[str] = typer.Option(None, help="Folder with the benchmark JSONL files."),
    trace_out: Optional[str] = typer.Option(None, help="Write the trace as JSON here (also on failure)."),
    opt: list[str] = typer.Option([], help="Any strategy option, key=value (e.g. k=3, beam=2, n=5) (repeatable)."),
    show_tree: bool = typer.Option(False, help="tree: print the search tree after the answer."),
    tree_png: Optional[str] = typer.Option(None, help="tree: draw the search tree to this PNG file."),
    as_json: bool = typer.Option(False, "--json", help="Print the solution as JSON instead of streaming."),
    verbose: int = VERBOSE,
    run: dict[str, Any] = None,  # type: ignore[assignment]  # RunSettings' flags (takes)
) -> None:
    """Reason through one question step by step with a speculative strategy on the bundled pair
    (or any models, in-process or on OpenAI-compatible servers), streaming the trace;
    token-level speculation runs underneath."""
    setup_logging(verbose)
    from stepspec.orchestrator.reasoner import Reasoner
    from stepspec.orchestrator.run import ReasoningError
    from stepspec.orchestrator.strategies import get_strategy

    # the configuration and the question are checked first; models are prepared after
    options = {k: v for k, v in dict(first_target_steps=first_target_steps, gamma=gamma, max_gamma=max_gamma,
                                     takeover_tokens=takeover_tokens,
                                     cues=None if cues is None else tuple(c.strip() for c in cues.split(","))).items()
               if v is not None}
    judge_options = _judge_options(judge or get_strategy(strategy).default_judge, judge_opt, threshold, score_method)
    config = checked(RunSettings, "solve", **run).reasoner_config(strategy=strategy, judge=judge, judge_options=judge_options,
                                                router=router, router_options=parse_opts(router_opt, "--router-opt"),
                                                **{**options, **parse_opts(opt, "--opt")})
    question, reference, grader = _question(question, dataset, index, data_dir)
    with prepare_progress() if not as_json else contextlib.nullcontext() as on_prepare:
        reasoner = Reasoner.from_config(config, on_prepare=on_prepare)
    try:
        t0 = time.perf_counter()
        if not as_json:
            console.rule("question")
            console.print(question, highlight=False)
        with engine_progress() if not as_json else contextlib.nullcontext() as on_engine:
            reasoner.load(on_engine)
        startup = time.perf_counter() - t0
        if not as_json:
            console.rule(f"{strategy} trace")
        try:
            solution = reasoner.solve(question, on_step=None if as_json else print_step)
        except ReasoningError as e:
            saved = save_trace(e.trace, trace_out)
            err_console.print(f"[bold red]error:[/] {e}\n{len(e.trace.steps)} steps kept in {saved}", highlight=False)
            raise typer.Exit(2) from None
    finally:
        reasoner.close()
    trace = solution.trace
    if trace_out:
        save_trace(trace, trace_out)
    correct = None if grader is None else grader.grade(trace.text, reference)[grader.metrics[0]].correct
    if reference is not None:
        reference = grader.gold(reference)
    if as_json:
        console.print_json(json.dumps({"question": question, "answer": trace.answer, "reference": reference,
                                       "correct": correct, "startup_seconds": startup, "stats": solution.stats,
                                       "trace": json.loads(trace.to_json())}))
        return
    console.rule("result")
    console.print(_result_table(solution, reference, correct, startup))
    if show_tree or tree_png:
        _show_tree(trace, strategy, show_tree, tree_png)


def _judge_options(judge: str, judge_opt: list[str], threshold: Optional[float],
                   score_method: Optional[str]) -> dict[str, Any]:
    """--judge-opt's options, and the score judge's two shortcuts (refused for another judge)."""
    judge_options = parse_opts(judge_opt)
    for key, value in (("threshold", threshold), ("method", score_method)):
        if value is not None:
            if judge != "score":
                raise ValueError(f"--{key.replace('method', 'score-method')} is an option of the score judge; "
                                 "for other judges use --judge-opt key=value")
            judge_options[key] = value
    return judge_options


def _question(question: Optional[str], dataset: str, index: int, data_dir: Optional[str]):
    """The question, and where it comes from a dataset its reference and grader."""
    from stepspec.workflows.eval.datasets import load_dataset
    from stepspec.workflows.eval.graders import get_grader

    reference = grader = None
    if question is None:
        data = load_dataset(dataset, data_dir)
        if not 0 <= index < len(data.problems):
            raise DatasetError(f"--index {index} is out of range: {dataset} has {len(data.problems)} problems")
        question, reference, grader = data.problems[index].question, data.problems[index].reference, get_grader(data.grader)
    if not question.strip():
        raise ValueError("the question is empty; give the problem text to reason about")
    return question, reference, grader


def _result_table(solution, reference: Optional[str], correct: Optional[bool], startup: float) -> Table:
    """The answer and what it took: steps, tokens, target calls, time, token-level acceptance."""
    trace, stats = solution.trace, solution.stats
    table = Table(show_header=False)
    table.add_row("answer", str(trace.answer))
    if reference is not None:
        table.add_row("reference", reference)
        table.add_row("correct", "yes" if correct else "no")
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
    table.add_row("target calls", f"{trace.num_target_calls} ({trace.num_generate_calls.get(Author.TARGET, 0)} "
                                  f"generation batches, {trace.num_judge_calls} judge prompts)")
    table.add_row("time", f"{trace.seconds:.1f} s reasoning, {startup:.1f} s engine start")
    for role, sd in trace.spec_decoding.items():
        if sd["num_drafts"]:
            table.add_row(f"{role} token speculation",
                          f"acceptance {sd['acceptance_rate']:.2f}, {sd['mean_acceptance_length']:.2f} tokens per pass")
    return table


def _show_tree(trace, strategy: str, show_tree: bool, tree_png: Optional[str]) -> None:
    if not trace.search or "tree" not in trace.search:
        raise ValueError(f"--show-tree/--tree-png need a tree search (--strategy tree or tree-target), "
                         f"not '{strategy}'")
    from stepspec.workflows.cli.tree_view import draw_tree, rich_tree

    if show_tree:
        console.rule("search tree")
        console.print(rich_tree(trace))
    if tree_png:
        console.print(f"tree drawn: {draw_tree(trace, tree_png)}")


def print_step(record, width: int = 0) -> None:
    """One step as it joins the trace: who wrote it, and what became of the draft.

    The step's text shows once, as the trace reads it; a draft the target did not keep shows
    inside ``⟨rejected: ...⟩``, dimmed and struck, where it was thrown away. A step a
    token-level verifier cut reads: the kept drafted words, the rejected rest, the target's
    words. Example, the draft "She ate alternatively" cut at " alternatively":
    ``She ate⟨rejected:  alternatively⟩ 3 eggs.``
    """
    from rich.text import Text

    head = Text(f"[{record.index:>2}] ", style="dim")
    score = f" {record.score:.2f}" if record.score is not None else ""
    if record.judge in ("learned", "threshold"):  # a router's number is its p_target
        score = f" p_target{score}"
    cut = record.cut
    if record.author is Author.DRAFT:
        head.append(f"✓ draft{score}", style="bold green")
    elif cut is not None:
        head.append(f"✂ draft cut at token {cut['offset']} {cut['token']!r} (target logprob "
                    f"{cut['target_logprob']:.1f}, rank {cut['rank']}, rule {cut['rule']}) → target", style="bold yellow")
    elif record.draft_text is not None:
        head.append(f"✗ draft{score} ({record.judge}) → target", style="bold yellow")
    else:
        head.append("■ target" + (" (backoff: drafting does not pay at this load)" if record.backoff else ""),
                    style="bold blue")
    tokens = record.num_draft_tokens if record.author is Author.DRAFT else record.num_target_tokens
    head.append(f"  {tokens} tok" + (f" + {record.num_kept_tokens} kept" if record.num_kept_tokens else "")
                + ("" if record.complete else ", cut at the cap"), style="dim")
    console.print(head, soft_wrap=True)  # one line per step, never wrapped: its marks are what a reader scans
    if record.author is Author.DRAFT:
        console.print(Text(record.text, style="green"), highlight=False)
        return
    kept = cut["kept_text"] if cut is not None else ""
    line = Text(kept, style="green")
    if record.draft_text is not None:
        line.append(f"⟨rejected: {record.draft_text[len(kept):]}⟩", style="dim strike")
    line.append(record.text[len(kept):], style="blue" if record.draft_text is None else "yellow")
    console.print(line, highlight=False)


def save_trace(trace, path: Optional[str]) -> str:
    """Write the trace as JSON to ``path`` (default: a new stepspec-trace-*.json here); returns the path."""
    import tempfile

    if path is None:
        fd, path = tempfile.mkstemp(prefix="stepspec-trace-", suffix=".json", dir=".")
        os.close(fd)
    with open(path, "w") as f:
        f.write(trace.to_json())
    return path
