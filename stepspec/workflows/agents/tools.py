"""Tools: plain typed Python functions (or an MCP server's tools) an agent may call.

    from stepspec.workflows.agents.tools import tool

    @tool(side_effect_free=True, timeout=5)
    def calculator(expression: str) -> float:
        "Evaluate an arithmetic expression: + - * / ** ( ) and numbers."
        ...

The argument schema comes from the type hints (a parameter without one is an
error); a call's arguments are validated against it before the function runs.
A call runs with a timeout: an ``async def`` tool is cancelled, a plain
function runs in a daemon thread of its own that is abandoned on timeout
(Python cannot stop a thread; give long-running tools an ``async def``). Whatever happens, the agent
gets an observation back (the result, the validation error, the exception or
the timeout), never a crash.

``side_effect_free=True`` declares that calling the tool changes nothing
outside it, so an agent may run it speculatively, as soon as the draft writes
the call and before the step is accepted (:mod:`stepspec.workflows.agents.agent`). A tool not
declared so never runs before its step is accepted.

Workflow files name tools as ``module:function`` and only from the modules the
file lists in ``allowed_modules``; :func:`load_tool` checks that again.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import threading
import time
import typing
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from stepspec.common.names import closest
from stepspec.common.options import explain

DEFAULT_TIMEOUT = 10.0


class ToolError(ValueError):
    """A tool cannot be made from a function, or loaded from a module."""


@dataclass(frozen=True)
class ToolResult:
    """What one call gave: ``observation`` is what the agent reads."""

    ok: bool
    observation: str
    value: Any = None
    seconds: float = 0.0
    timed_out: bool = False


@dataclass(frozen=True)
class Tool:
    """A callable the agent may call, declared as an OpenAI function schema (:meth:`openai`).
    A typed function's argument schema comes from its type hints (``args_model``); a tool
    of an MCP server brings its JSON schema (``schema``)."""

    name: str
    fn: Callable[..., Any]
    description: str
    side_effect_free: bool = False
    timeout: float = DEFAULT_TIMEOUT
    args_model: type[BaseModel] | None = field(default=None, repr=False)
    schema: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def parameters(self) -> dict[str, Any]:
        """JSON Schema of the arguments."""
        if self.args_model is not None:
            return self.args_model.model_json_schema()
        return dict(self.schema or {"type": "object", "properties": {}})

    def openai(self) -> dict[str, Any]:
        """The tool as an OpenAI function schema: what a chat template renders and a server declares."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    @property
    def parameter_names(self) -> tuple[str, ...]:
        if self.args_model is not None:
            return tuple(self.args_model.model_fields)
        return tuple(self.parameters.get("properties", {}))

    def signature(self) -> str:
        """How the agent's prompt shows the tool: name, arguments with types, description."""
        if self.args_model is not None:
            types = {n: _type_name(f.annotation) for n, f in self.args_model.model_fields.items()}
        else:
            types = {n: str(p.get("type", "any")) for n, p in self.parameters.get("properties", {}).items()}
        return f"{self.name}({', '.join(f'{n}: {t}' for n, t in types.items())}): {self.description}"

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        """The arguments checked and converted; ValueError naming what is wrong."""
        if self.args_model is None:
            from jsonschema import validators

            schema = self.parameters
            error = next(iter(validators.validator_for(schema)(schema).iter_errors(args)), None)
            if error is not None:
                where = ".".join(str(p) for p in error.absolute_path)
                raise ValueError(f"bad arguments for {self.name}: {f'{where}: ' if where else ''}{error.message}. "
                                 f"It takes {self.signature()}")
            return dict(args)
        try:
            return self.args_model.model_validate(args).model_dump()
        except ValidationError as e:
            raise ValueError(f"{explain(self.args_model, e, f'bad arguments for {self.name}')}. It takes "
                             f"{self.signature()}") from None

    async def call(self, args: dict[str, Any]) -> ToolResult:
        t0 = time.perf_counter()
        try:
            checked = self.validate(args)
        except ValueError as e:
            return ToolResult(False, f"error: {e}", seconds=time.perf_counter() - t0)
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await asyncio.wait_for(self.fn(**checked), self.timeout)
            else:
                value = await asyncio.wait_for(_in_daemon_thread(self.fn, checked), self.timeout)
        except (asyncio.TimeoutError, TimeoutError):
            return ToolResult(False, f"error: {self.name} timed out after {self.timeout:g} s",
                              seconds=time.perf_counter() - t0, timed_out=True)
        except Exception as e:  # the tool's own failure is the agent's observation, not a crash
            return ToolResult(False, f"error: {self.name} raised {type(e).__name__}: {e}",
                              seconds=time.perf_counter() - t0)
        return ToolResult(True, _show(value), value, time.perf_counter() - t0)


def _in_daemon_thread(fn: Callable[..., Any], args: dict[str, Any]) -> "asyncio.Future[Any]":
    """``fn(**args)`` in a daemon thread of its own: a call that never returns is left
    behind without holding up the event loop's shutdown (the default executor would)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def work() -> None:
        try:
            result: tuple[bool, Any] = (True, fn(**args))
        except BaseException as e:  # handed to the awaiting coroutine, which reports it
            result = (False, e)
        try:
            loop.call_soon_threadsafe(settle, *result)
        except RuntimeError:  # the loop closed while the call ran: nobody is waiting
            pass

    threading.Thread(target=work, name=f"tool-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, side_effect_free: bool = False,
         timeout: float = DEFAULT_TIMEOUT, description: str | None = None) -> Any:
    """Declare a function a tool (usable bare, ``@tool``, or with options)."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        f.__stepspec_tool__ = make_tool(f, name=name, side_effect_free=side_effect_free,  # type: ignore[attr-defined]
                                        timeout=timeout, description=description)
        return f

    return wrap(fn) if fn is not None else wrap


def make_tool(fn: Callable[..., Any], *, name: str | None = None, side_effect_free: bool = False,
              timeout: float = DEFAULT_TIMEOUT, description: str | None = None) -> Tool:
    """A Tool from a typed function; every parameter needs a type hint."""
    if not callable(fn):
        raise ToolError(f"{fn!r} is not callable")
    if timeout <= 0:
        raise ToolError(f"tool timeout must be > 0 seconds, got {timeout}")
    tool_name = name or fn.__name__
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:
        raise ToolError(f"tool '{tool_name}': its type hints cannot be read ({e})") from e
    fields: dict[str, Any] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolError(f"tool '{tool_name}': *{p.name} parameters have no schema; name each argument")
        if p.name not in hints:
            raise ToolError(f"tool '{tool_name}': parameter '{p.name}' has no type hint; tools need typed "
                            "parameters (they become the argument schema)")
        fields[p.name] = (hints[p.name], ... if p.default is p.empty else p.default)
    model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    doc = description or inspect.getdoc(fn) or ""
    return Tool(tool_name, fn, doc.strip().split("\n\n")[0].replace("\n", " "), side_effect_free, timeout, model)


def as_tool(obj: Any) -> Tool:
    """A Tool from a Tool, a function declared with @tool, or a plain typed function."""
    if isinstance(obj, Tool):
        return obj
    declared = getattr(obj, "__stepspec_tool__", None)
    return declared if isinstance(declared, Tool) else make_tool(obj)


def load_tool(ref: str, allowed_modules: list[str] | tuple[str, ...], *, name: str | None = None,
              side_effect_free: bool | None = None, timeout: float | None = None,
              description: str | None = None) -> Tool:
    """The tool ``module:function``, imported only from an allowed module. Options given
    here replace the decorator's."""
    module_name, _, fn_name = ref.partition(":")
    if not any(module_name == m or module_name.startswith(m + ".") for m in allowed_modules):
        raise ToolError(f"tool '{ref}': module '{module_name}' is not in the allowed modules "
                        f"({', '.join(allowed_modules) or 'none'})")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ToolError(f"tool '{ref}': cannot import module '{module_name}' ({e})") from e
    fn = getattr(module, fn_name, None)
    if fn is None:
        public = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        match = closest(fn_name, public)
        hint = f"; did you mean '{module_name}:{match}'?" if match else ""
        raise ToolError(f"tool '{ref}': module '{module_name}' has no '{fn_name}'{hint}")
    base = as_tool(fn)
    return replace(base, name=name or base.name, description=description or base.description,
                   side_effect_free=base.side_effect_free if side_effect_free is None else side_effect_free,
                   timeout=base.timeout if timeout is None else timeout)
