"""``stepspec serve``: reasoners behind an OpenAI-compatible endpoint."""

from __future__ import annotations

from typing import Any, Optional

import typer

from stepspec.orchestrator.config import RunSettings
from stepspec.common.options import checked
from stepspec.workflows.cli.common import (JUDGE, JUDGE_OPT, ROUTER, ROUTER_OPT, STRATEGY, VERBOSE, app, console, parse_opts,
                                  setup_logging, takes)
from stepspec.workflows.cli.progress import prepare_progress
from stepspec.workflows.serve.settings import ServeSettings


@app.command()
@takes(ServeSettings, "server")
@takes(RunSettings, "run", skip=("max_num_seqs",), rename={"api_key_env": "engine_api_key_env"})
def serve(
    workflow: Optional[str] = typer.Argument(None, help="A workflow YAML file: each reasoner it declares is served "
                                             "as a model of its name (default: one reasoner, from the flags)."),
    name: str = typer.Option("stepspec", help="The model name clients ask for (the reasoner the flags describe)."),
    strategy: str = STRATEGY,
    judge: Optional[str] = JUDGE,
    judge_opt: list[str] = JUDGE_OPT,
    router: Optional[str] = ROUTER,
    router_opt: list[str] = ROUTER_OPT,
    opt: list[str] = typer.Option([], help="Any strategy option, key=value (repeatable)."),
    verbose: int = VERBOSE,
    server: dict[str, Any] = None,  # type: ignore[assignment]  # ServeSettings' flags (takes)
    run: dict[str, Any] = None,  # type: ignore[assignment]  # RunSettings' flags (takes)
) -> None:
    """Serve speculative reasoning behind an OpenAI-compatible endpoint (/v1/chat/completions,
    /v1/completions, /v1/models, /health): the steps stream as reasoning_content, the answer
    as content; a request's strategy and options go in its "stepspec" object (the openai
    SDK's extra_body). Binds 127.0.0.1 unless --host says otherwise."""
    import uvicorn

    from stepspec.orchestrator.reasoner import Reasoner
    from stepspec.workflows.serve.app import build_app

    setup_logging(verbose)
    settings = checked(ServeSettings, "serve", **server)
    settings.api_key()  # an unset key variable fails before any model is prepared
    close = None
    if workflow is not None:
        from stepspec.workflows.flows.runner import WorkflowRun, check_workflow
        from stepspec.workflows.flows.schema import load_workflow

        w = load_workflow(workflow)
        check_workflow(w)
        run = WorkflowRun(w)
        if not run.reasoners:
            raise ValueError(f"{workflow} declares no reasoners: nothing to serve (add a 'reasoners:' section)")
        reasoners, close = run.reasoners, run.close
    else:
        config = checked(RunSettings, "serve", **run).reasoner_config(
            strategy=strategy, judge=judge, judge_options=parse_opts(judge_opt), router=router,
            router_options=parse_opts(router_opt, "--router-opt"), **parse_opts(opt, "--opt"))
        with prepare_progress() as on_prepare:
            reasoners = {name: Reasoner.from_config(config, on_prepare=on_prepare)}
    console.print(f"serving {', '.join(reasoners)} on http://{settings.host}:{settings.port}/v1 (engines start first)",
                  highlight=False)
    uvicorn.run(build_app(reasoners, settings, close), host=settings.host, port=settings.port,
                log_level="info" if verbose else "warning")
