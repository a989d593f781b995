"""What every ``stepspec`` command shares: the app, the consoles, the flags declared once from
the settings models' fields, and the logging setup. Command groups live in modules of their
own and register on :data:`app`; :mod:`workflows.cli.app` loads them all."""

from __future__ import annotations

import logging
import os
from typing import Any, Awaitable, Callable, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console

from orchestrator.config import ReasonerConfig, RunSettings

app = typer.Typer(
    help="stepspec: reasoning-level speculative orchestration over vLLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

T = TypeVar("T")
console = Console()
err_console = Console(stderr=True)

# The packages whose warnings the console shows at verbosity 0 (anything at ERROR shows).
VERBOSE = typer.Option(0, "--verbose", "-v", count=True,
                       help="Show vLLM's warnings (-v) or all its logs (-vv); also $STEPSPEC_VERBOSE. "
                            "They always go to a log file (its tail is shown on an engine failure).")


def opt(model: type[BaseModel], name: str, *flags: str, show: Any = None, more: str = "") -> Any:
    """A typer option whose default and help are the pydantic field's: declared once, there.
    ``show``: how the default is written on the command line; ``more``: what the help adds."""
    field = model.model_fields[name]
    default = field.get_default(call_default_factory=True)
    return typer.Option(default if show is None else show(default), *flags,
                        help=" ".join(t for t in (field.description, more) if t))


def escape(text: str) -> str:
    """--delimiter's default as typed: a blank line is '\\n\\n'."""
    return text.encode("unicode_escape").decode("ascii")


def unescape(text: str) -> str:
    """Shell-friendly escapes in --delimiter: '\\n\\n' is a blank line."""
    return text.encode("utf-8").decode("unicode_escape")


def fields(model: type[BaseModel], flags: dict[str, Any]) -> dict[str, Any]:
    """The flags named like ``model``'s fields (the delimiter unescaped)."""
    picked = {k: v for k, v in flags.items() if k in model.model_fields}
    if "delimiter" in picked:
        picked["delimiter"] = unescape(picked["delimiter"])
    return picked


# The options solve, bench and router collect share: defaults and help from their declarations.
STRATEGY = opt(ReasonerConfig, "strategy")
JUDGE = opt(ReasonerConfig, "judge")
ROUTER = opt(ReasonerConfig, "router")
TARGET = opt(RunSettings, "target")
DRAFT = opt(RunSettings, "draft")
TARGET_SPEC = opt(RunSettings, "target_spec", "--spec")
DRAFT_SPEC = opt(RunSettings, "draft_spec")
TARGET_DTYPE = opt(RunSettings, "target_dtype")
DRAFT_DTYPE = opt(RunSettings, "draft_dtype")
NUM_SPECULATIVE_TOKENS = opt(RunSettings, "num_speculative_tokens")
TARGET_URL = opt(RunSettings, "target_url", more="--target is then the model name it serves.")
DRAFT_URL = opt(RunSettings, "draft_url", more="--draft is then the model name it serves.")
API_KEY_ENV = opt(RunSettings, "api_key_env")
SESSION_HEADER = opt(RunSettings, "session_header")
MAX_TOKENS = opt(RunSettings, "max_tokens")
MAX_STEP_TOKENS = opt(RunSettings, "max_step_tokens")
MAX_STEPS = opt(RunSettings, "max_steps")
TIMEOUT = opt(RunSettings, "timeout")
DELIMITER = opt(RunSettings, "delimiter", show=escape, more="Escapes allowed (\\n).")
KV_CACHE_GIB = opt(RunSettings, "kv_cache_gib")
MAX_MODEL_LEN = opt(RunSettings, "max_model_len")


def setup_logging(verbose: int) -> None:
    """Quiet by default: vLLM's lines (this process and its engine subprocesses) go to a
    log file; the console shows stepspec's own warnings and anyone's errors."""
    from engine.logs import OWN_LOGGERS, log_dir, route_vllm_logs, verbosity_from_env

    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    verbosity = verbosity_from_env(verbose)
    route_vllm_logs(log_dir(), verbosity)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    if verbosity == 0:
        handler.addFilter(lambda r: r.levelno >= logging.ERROR or r.name.split(".")[0] in OWN_LOGGERS)
    # stepspec's own INFO lines reach the console at -vv only (the run log has them always)
    handler.setLevel(logging.INFO if verbosity > 1 else logging.WARNING)
    logging.basicConfig(level=logging.INFO if verbosity > 1 else logging.WARNING, handlers=[handler], force=True)


def run_cancellable(make: Callable[[], Awaitable[T]]) -> T:
    """``asyncio.run(make())``, where Ctrl-C or ``kill`` (SIGTERM) cancels the task: its
    ``finally`` blocks save what is done and stop the engines (vLLM's engine process
    included), then asyncio.CancelledError is raised."""
    import asyncio
    import signal

    async def cancellable() -> T:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        return await make()

    return asyncio.run(cancellable())
