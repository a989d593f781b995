"""What every ``stepspec`` command shares: the app, the consoles, the flags declared once from
the settings models' fields, and the logging setup. Command groups live in modules of their
own and register on :data:`app`; :mod:`stepspec.workflows.cli.app` loads them all."""

from __future__ import annotations

import enum
import functools
import inspect
import json
import logging
import os
import types
from typing import Any, Awaitable, Callable, Iterable, Literal, Optional, TypeVar, Union, get_origin

import typer
from pydantic import BaseModel
from rich.console import Console

from stepspec.common.options import strip_none
from stepspec.orchestrator.config import ReasonerConfig

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


def parse_opts(pairs: list[str], flag: str = "--judge-opt") -> dict:
    """``key=value`` pairs (a repeatable flag) as a dict; a value is JSON where it parses, else a string."""
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


# How a field's flag is worded where its name and description alone do not say it (any model's field).
_WORDING: dict[str, dict[str, Any]] = {
    "target_spec": {"flags": ("--spec",)},
    "delimiter": {"show": escape, "more": "Escapes allowed (\\n)."},
    "target_url": {"more": "--target is then the model name it serves."},
    "draft_url": {"more": "--draft is then the model name it serves."},
}


def _flag_type(annotation: Any) -> Any:
    """The type typer parses a field's flag as: a Literal or a tuple of names is a string (the
    model checks it; a tuple or list is given comma-separated); optional stays optional."""
    base, nullable = strip_none(annotation)
    if get_origin(base) in (Literal, tuple, list, Union, types.UnionType) or _is_model(base):
        base = str  # a union: a method or "auto"; a model: JSON
    elif not (base in (str, int, float, bool) or (isinstance(base, type) and issubclass(base, enum.Enum))):
        raise TypeError(f"a field of type {annotation} has no flag; declare it in the command")
    return Optional[base] if nullable else base


def _json_flag(value: str, name: str) -> Any:
    """A flag whose field is a model: its JSON value (the model checks the keys)."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        flag_name = "--" + name.replace("_", "-")
        raise typer.BadParameter(f"{flag_name} wants JSON, e.g. '{{\"max_rank\": 2}}'; got {value!r} ({e})") from e


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _is_model_field(model: type[BaseModel], name: str) -> bool:
    return _is_model(strip_none(model.model_fields[name].annotation)[0])


def _is_list(model: type[BaseModel], name: str) -> bool:
    return get_origin(strip_none(model.model_fields[name].annotation)[0]) in (tuple, list)


def flag(model: type[BaseModel], name: str) -> Any:
    """The typer option of ``model``'s field ``name``: its default, help and wording from the
    declaration (a tuple field comma-separated)."""
    wording = _WORDING.get(name, {})
    if _is_list(model, name):
        return opt(model, name, *wording.get("flags", ()), show=lambda v: v if v is None else ",".join(v),
                   more="Comma-separated.")
    if _is_model_field(model, name):
        return opt(model, name, *wording.get("flags", ()), show=lambda v: v if v is None else v.model_dump_json(),
                   more="JSON.")
    return opt(model, name, *wording.get("flags", ()), show=wording.get("show"), more=wording.get("more", ""))


def takes(model: type[BaseModel], into: str, *, skip: Iterable[str] = (), only: Iterable[str] | None = None,
          rename: dict[str, str] | None = None) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Give the decorated command a flag per field of ``model`` (:func:`flag`: declared once, in the
    model) and hand it their values as a dict in its parameter ``into``, ready for
    ``model(**values)``: the delimiter unescaped, a comma-separated list a tuple. Fields in
    ``skip``, outside ``only``, or that the command declares as parameters itself are left out
    (the command words those). ``rename``: a field's parameter (and flag) name where two models
    share a field's name (``serve``'s own ``api_key_env``, its engines' ``engine_api_key_env``).

        @takes(RunSettings, "run")
        def solve(question: str = typer.Argument(...), run: dict = None): settings = RunSettings(**run)
    """
    rename = rename or {}

    def wrap(command: Callable[..., T]) -> Callable[..., T]:
        own = inspect.signature(command, eval_str=True)
        names = [n for n in (only or model.model_fields) if n not in set(skip) and n not in own.parameters]
        params = {rename.get(n, n): n for n in names}
        added = [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, default=flag(model, n),
                                   annotation=_flag_type(model.model_fields[n].annotation)) for p, n in params.items()]

        @functools.wraps(command)
        def run(**kwargs: Any) -> T:
            values = {n: kwargs.pop(p) for p, n in params.items()}
            for n, v in values.items():
                if isinstance(v, str) and _is_list(model, n):
                    values[n] = tuple(x.strip() for x in v.split(",") if x.strip())
                elif isinstance(v, str) and _is_model_field(model, n):
                    values[n] = _json_flag(v, n)
            if isinstance(values.get("delimiter"), str):
                values["delimiter"] = unescape(values["delimiter"])
            return command(**kwargs, **{into: values})

        kept = [p for p in own.parameters.values() if p.name != into]
        run.__signature__ = own.replace(parameters=[*kept, *added])  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in (*kept, *added)}
        return run

    return wrap


def strategy_flag(owner: str, name: str, *flags: str, more: str = "", about: str = "") -> Any:
    """A flag for an option of strategy ``owner`` (or of the score judge), unset unless given:
    its help and default are the options model's (``about``: where it has no description)."""
    from stepspec.judges.registry import judge_options_model
    from stepspec.orchestrator.strategies import STRATEGIES

    model = judge_options_model("score") if owner == "score judge" else STRATEGIES[owner].options_model
    field = model.model_fields[name]
    default = ", ".join(field.default) if isinstance(field.default, tuple) else field.default
    return typer.Option(None, *flags,
                        help=f"{owner}: {field.description or about} (default {default}). {more}".strip())


# The flags solve, bench and serve share that no settings model declares (those: :func:`takes`).
STRATEGY = opt(ReasonerConfig, "strategy")
JUDGE = opt(ReasonerConfig, "judge")
ROUTER = opt(ReasonerConfig, "router")
JUDGE_OPT = typer.Option([], help="Any judge option, key=value (repeatable).")
ROUTER_OPT = typer.Option([], help="Any router option, key=value, e.g. tau=0.3 (repeatable).")
GAMMA = strategy_flag("lookahead", "gamma")
MAX_GAMMA = strategy_flag("lookahead", "max_gamma", about="upper bound of the adaptive gamma")


def setup_logging(verbose: int) -> None:
    """Quiet by default: vLLM's lines (this process and its engine subprocesses) go to a
    log file; the console shows stepspec's own warnings and anyone's errors."""
    from stepspec.engine.logs import OWN_LOGGERS, log_dir, route_vllm_logs, verbosity_from_env

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


def run_interruptible(make: Callable[[], Awaitable[T]], interrupted: str) -> T:
    """:func:`run_cancellable`; on Ctrl-C or SIGTERM, "interrupted: ``interrupted``" (what is
    saved and how to go on) and exit code 130."""
    import asyncio

    try:
        return run_cancellable(make)
    except (KeyboardInterrupt, asyncio.CancelledError):
        err_console.print(f"[bold yellow]interrupted[/]: {interrupted}", highlight=False)
        raise typer.Exit(130) from None
