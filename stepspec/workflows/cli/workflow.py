"""``stepspec validate``, ``schema``, ``run``: workflow files; ``stepspec lm-eval``: the harness's command line."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Optional

import typer

from stepspec.workflows.cli.common import VERBOSE, app, console, err_console, run_cancellable, setup_logging


@app.command()
def validate(path: str = typer.Argument(..., help="A workflow YAML file.")) -> None:
    """Check a workflow file without loading any model: syntax, duplicate keys, unknown keys,
    every name it uses (engines, models, strategies, judges, routers and their options, tools),
    references and cycles; errors name the YAML line and the closest valid name. Each MCP
    server is started, its tools listed, and stopped."""
    from stepspec.workflows.flows.runner import check_workflow, list_mcp_tools
    from stepspec.workflows.flows.schema import load_workflow

    w = load_workflow(path)
    notes = check_workflow(w, check_env=False)
    listed = asyncio.run(list_mcp_tools(w))  # each MCP server started, listed and stopped
    s = w.spec
    nodes = len(s.workflow.nodes) if s.workflow else 0
    console.print(f"{path}: valid ({len(s.engines)} engines, {len(s.reasoners)} reasoners, {len(s.tools)} tools, "
                  f"{len(s.mcp_servers)} MCP servers, {len(s.agents)} agents, {nodes} workflow nodes)",
                  highlight=False)
    for server, tools in listed.items():
        console.print(f"MCP server {server}: {', '.join(t.name for t in tools) or 'no tools'}", highlight=False)
    for note in notes:
        console.print(f"[yellow]note[/]: {note}", highlight=False)


@app.command()
def schema(out: Optional[str] = typer.Option(None, help="Write it to this file instead of printing it.")) -> None:
    """The JSON Schema of workflow files (point your editor's YAML support at it)."""
    from stepspec.workflows.flows.schema import json_schema

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

    from stepspec.workflows.flows.runner import (NodeStatus, RunStatus, WorkflowRun, check_inputs, check_workflow,
                                        load_record, resumed_records)
    from stepspec.workflows.flows.schema import load_workflow

    setup_logging(verbose)
    w = load_workflow(path)
    previous = None if resume is None else load_record(resume)
    inputs = {**((previous or {}).get("inputs") or {}), **_inputs(input)}
    record_path = output or resume or os.path.join(
        "runs", f"workflow-{os.path.basename(path).rsplit('.', 1)[0]}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    # the file's names, the inputs and the record resumed are checked as `stepspec validate` does,
    # before any model is prepared
    check_workflow(w)
    values = check_inputs(w, inputs)
    if previous is not None:
        _print_resumed(resume, resumed_records(w, previous, values))
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
    --include_path stepspec/workflows/lm_eval_tasks --limit 3` (all arguments are the harness's)."""
    setup_logging(0)
    try:
        from stepspec.workflows.eval import lm_eval_model
    except ImportError as e:
        raise ValueError(f"stepspec lm-eval needs lm-evaluation-harness: pip install 'stepspec[eval]' ({e})") from e
    lm_eval_model.main(list(ctx.args))


def _inputs(pairs: list[str]) -> dict[str, str]:
    """--input key=value pairs (values stay strings: the workflow's inputs type them)."""
    inputs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--input wants key=value, got {pair!r}")
        inputs[key] = value
    return inputs


def _print_resumed(resume: str, kept: dict) -> None:
    """What a resumed run keeps: its finished nodes, and the items done of a map node that is not."""
    from stepspec.workflows.flows.runner import NodeStatus

    finished = [n for n, r in kept.items() if r.status == NodeStatus.DONE]
    maps = [f"{n}: {sum(i.status == NodeStatus.DONE for i in r.details['items'])} of {len(r.details['items'])} "
            "items done before" for n, r in kept.items() if r.status != NodeStatus.DONE and r.details.get("items")]
    console.print(f"resuming {resume}: {len(finished)} of {len(kept)} nodes done before"
                  + (f" ({', '.join(finished)})" if finished else "") + "".join(f"; {m}" for m in maps),
                  highlight=False)
