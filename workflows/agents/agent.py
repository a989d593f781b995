"""The agent API: reason, act, observe, under a speculative reasoning strategy.

    from workflows.agents.agent import Agent
    from workflows.examples.tools import calculator

    agent = Agent(reasoner, tools=[calculator])
    result = agent.run("Natalia sold clips to 48 friends in April and half as many in May. How many in all?")
    print(result.answer, [c.tool for c in result.tool_calls])

Each thought is a reasoning step written under the reasoner's strategy (the
draft writes it, the judge or router decides, the target rewrites what it
must). A step that calls a tool ends the turn::

    Action: calculator({"expression": "48 / 2"})

The agent parses the call (JSON arguments, ``name(key=value)`` or a single bare
value are all understood; anything else gets an observation saying how to
write it), validates it against the tool's schema, runs it with its timeout
and answers with ``Observation: ...``; the reasoner then continues the same
chat. The answer is the first ``\\boxed{}``.

Speculative tool calls: a tool declared ``side_effect_free`` is started as soon
as the draft writes the call, while the target is still judging the step. If
the step is accepted (or the target writes the same call) the result is
already there; otherwise it is discarded. Tools not declared side-effect-free
run only after their step is part of the trace.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from engine.types import GenerationRequest, GenerationResult
from orchestrator.prompts import Chat
from orchestrator.reasoner import Reasoner
from orchestrator.trace import StepRecord, Trace
from workflows.agents.tools import Tool, ToolResult, as_tool

# Where a step starts a tool call (tolerant: "**Action**:", "action :", list markers).
ACTION_START = r"(?im)^[\s>*_`#\-\d.)]*action[\s*_`]*:[\s*_`]*[A-Za-z_]\w*\s*\("
_ACTION = re.compile(r"(?im)^[\s>*_`#\-\d.)]*action[\s*_`]*:[\s*_`]*([A-Za-z_]\w*)\s*\((.*)\)[\s*_`]*$")
OBSERVATION = "Observation:"

DEFAULT_SYSTEM_PROMPT = """You solve the task step by step, one short step per paragraph.
You can use these tools:
{tools}
To use a tool, write a step that is only the call, for example:
Action: {example}
then stop: the result comes back as "Observation: ...". Use the tools for every calculation.
When you know the final answer, write it as \\boxed{{answer}}."""


class AgentError(ValueError):
    """An agent was misconfigured (a duplicate tool name, no tools where some are needed)."""


@dataclass(frozen=True)
class ToolCall:
    tool: str
    args: dict[str, Any]


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call of a run. ``speculative``: started from a drafted step before it
    was accepted; ``used``: its result reached the agent (else it was discarded)."""

    tool: str
    args: dict[str, Any]
    observation: str
    ok: bool
    speculative: bool
    used: bool
    seconds: float = 0.0
    timed_out: bool = False


@dataclass(frozen=True)
class AgentResult:
    task: str
    answer: str | None
    stop_reason: str  # "answer", "max_iterations", or the last trace's (max_tokens, error, ...)
    traces: tuple[Trace, ...]
    tool_calls: tuple[ToolCallRecord, ...]
    messages: tuple[tuple[str, str], ...] = field(default=())  # the whole chat, observations included

    @property
    def num_iterations(self) -> int:
        return len(self.traces)


def parse_action(text: str, tools: dict[str, Tool]) -> ToolCall | str:
    """The tool call a step makes, or an observation explaining what is wrong with it."""
    m = _ACTION.search(text)
    if m is None:
        return (f'error: the call is not written as Action: tool_name({{"argument": value}}); '
                f"tools: {', '.join(tools) or 'none'}")
    name, raw = m.group(1), m.group(2).strip()
    if name not in tools:
        close = [t for t in tools if t.lower() == name.lower()]
        if len(close) == 1:
            name = close[0]
        else:
            return f"error: there is no tool '{name}'; tools: {', '.join(tools) or 'none'}"
    t = tools[name]
    args = _parse_args(raw, t)
    if isinstance(args, str):
        return f"error: cannot read the arguments of {name}: {args}. Write Action: {name}({_example_args(t)})"
    return ToolCall(name, args)


def _parse_args(raw: str, t: Tool) -> dict[str, Any] | str:
    names = t.parameter_names
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = None
    else:
        if isinstance(value, dict):
            return value
        return {names[0]: value} if len(names) == 1 else f"{len(names)} arguments expected, one value given"
    try:
        call = ast.parse(f"f({raw})", mode="eval").body
        assert isinstance(call, ast.Call)
        positional = [ast.literal_eval(a) for a in call.args]
        keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    except (SyntaxError, ValueError, AssertionError, TypeError):
        if len(names) == 1 and t.args_model.model_fields[names[0]].annotation is str:
            return {names[0]: raw.strip().strip("'\"")}  # a bare expression for a one-string tool
        return f"'{raw}' is neither JSON nor name=value pairs"
    if len(positional) > len(names):
        return f"{len(positional)} values given, {t.name} takes {len(names)}"
    if len(positional) == 1 and not keywords and isinstance(positional[0], dict) and len(names) != 1:
        return positional[0]
    return {**dict(zip(names, positional)), **keywords}


def _example_args(t: Tool) -> str:
    return json.dumps({n: "..." for n in t.parameter_names})


def _key(call: ToolCall) -> str:
    return f"{call.tool}:{json.dumps(call.args, sort_keys=True, default=str)}"


class _DraftWatcher:
    """The draft engine as the agent sees it: every drafted step that calls a
    side-effect-free tool starts that call at once."""

    def __init__(self, engine: Any, agent: "Agent", started: dict[str, asyncio.Task]) -> None:
        self.engine, self.agent, self.started = engine, agent, started

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = await self.engine.generate(requests)
        for r in results:
            for c in r.completions:
                if not re.search(ACTION_START, c.text):
                    continue
                call = parse_action(c.text, self.agent.tools)
                if isinstance(call, ToolCall) and self.agent.tools[call.tool].side_effect_free:
                    key = _key(call)
                    if key not in self.started:
                        self.started[key] = asyncio.ensure_future(self.agent.tools[call.tool].call(call.args))
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class Agent:
    """A reasoner with tools, a system prompt and an iteration limit."""

    def __init__(self, reasoner: Reasoner, tools: Sequence[Any] = (), *, system_prompt: str | None = None,
                 max_iterations: int = 8, speculative_tools: bool = True,
                 demonstration: Sequence[Mapping[str, str]] = ()) -> None:
        """``demonstration``: a worked exchange shown before the task, as chat turns
        (user task, assistant thoughts and calls, user observations, ...): small
        models follow a shown exchange far better than a described format."""
        if max_iterations < 1:
            raise AgentError(f"max_iterations must be >= 1, got {max_iterations}")
        roles = [m.get("role") for m in demonstration]
        if any(r not in ("user", "assistant") for r in roles) or (roles and (roles[0] != "user"
                                                                             or roles[-1] != "assistant")):
            raise AgentError("a demonstration is user/assistant turns, opening with the user's task and ending "
                             "with the assistant's answer")
        self.demonstration = [{"role": m["role"], "content": m["content"]} for m in demonstration]
        self.reasoner = reasoner
        self.tools: dict[str, Tool] = {}
        for obj in tools:
            t = as_tool(obj)
            if t.name in self.tools:
                raise AgentError(f"two tools are named '{t.name}'; give one another name")
            self.tools[t.name] = t
        listing = "\n".join(f"- {t.signature()}" for t in self.tools.values()) or "(none)"
        first = next(iter(self.tools.values()), None)
        example = f"{first.name}({_example_args(first)})" if first else "none"
        self.system_prompt = (system_prompt or DEFAULT_SYSTEM_PROMPT).replace("{tools}", listing) \
            .replace("{example}", example).replace("{{", "{").replace("}}", "}")
        self.max_iterations = max_iterations
        self.speculative_tools = speculative_tools
        self.rules = replace(reasoner.rules, action_pattern=ACTION_START, action_stop=OBSERVATION)

    async def arun(self, task: str, on_step: Callable[[StepRecord], None] | None = None) -> AgentResult:
        if not task or not task.strip():
            raise ValueError("the task is empty; give the agent something to do")
        messages: list[dict[str, str]] = [{"role": "system", "content": self.system_prompt}, *self.demonstration,
                                          {"role": "user", "content": task}]
        shown = len(messages) - 1  # the messages before the task
        traces: list[Trace] = []
        records: list[ToolCallRecord] = []
        stop = "max_iterations"
        for _ in range(self.max_iterations):
            started: dict[str, asyncio.Task] = {}
            draft = None
            if self.speculative_tools and self.reasoner.draft is not None:
                draft = _DraftWatcher(self.reasoner.draft, self, started)
            try:
                solution = await self.reasoner.asolve(Chat(task, messages), on_step, rules=self.rules, draft=draft)
                trace = solution.trace
                traces.append(trace)
                if trace.stop_reason != "action":
                    stop = trace.stop_reason
                    messages.append({"role": "assistant", "content": trace.text})
                    break
                call = parse_action(trace.steps[-1].text, self.tools)
                if isinstance(call, str):
                    result, speculative = ToolResult(False, call), False
                elif _key(call) in started:  # the draft wrote this very call: it is running or done
                    result, speculative = await started.pop(_key(call)), True
                else:
                    result, speculative = await self.tools[call.tool].call(call.args), False
                if not isinstance(call, str):
                    records.append(ToolCallRecord(call.tool, call.args, result.observation, result.ok, speculative,
                                                  True, result.seconds, result.timed_out))
                messages.append({"role": "assistant", "content": trace.text})
                messages.append({"role": "user", "content": f"{OBSERVATION} {result.observation}"})
            finally:
                records.extend(await _discard(started))
        answer = next((t.answer for t in reversed(traces) if t.answer is not None), None)
        return AgentResult(task, answer, stop, tuple(traces), tuple(records),
                           tuple((m["role"], m["content"]) for m in messages[:1] + messages[shown:]))

    def run(self, task: str, on_step: Callable[[StepRecord], None] | None = None) -> AgentResult:
        return self.reasoner.run_sync(self.arun(task, on_step))


async def _discard(started: dict[str, asyncio.Task]) -> list[ToolCallRecord]:
    """Speculative calls whose step was not accepted: cancelled if still running,
    recorded as discarded."""
    out = []
    for key, task in started.items():
        tool, _, args = key.partition(":")
        if not task.done():
            task.cancel()
            out.append(ToolCallRecord(tool, json.loads(args), "discarded while running", False, True, False))
            continue
        try:
            r = task.result()
        except asyncio.CancelledError:
            continue
        out.append(ToolCallRecord(tool, json.loads(args), r.observation, r.ok, True, False, r.seconds, r.timed_out))
    started.clear()
    return out
