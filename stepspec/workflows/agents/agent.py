"""The agent API: reason, act, observe, under a speculative reasoning strategy.

    from stepspec.workflows.agents.agent import Agent
    from stepspec.workflows.examples.tools import calculator

    agent = Agent(reasoner, tools=[calculator])
    result = agent.run("Natalia sold clips to 48 friends in April and half as many in May. How many in all?")
    print(result.answer, [c.tool for c in result.tool_calls])

Each thought is a reasoning step written under the reasoner's strategy (the
draft writes it, the judge or router decides, the target rewrites what it
must). A step that calls a tool ends the turn.

The tools are declared to the model in its own tool format (``tool_format="template"``,
the default where the model's chat template renders tools): the template renders
their OpenAI function schemas, the call is read by a vLLM tool parser
(:mod:`stepspec.workflows.agents.toolcalls`), and its result goes back as a ``tool`` message
answering the call. A drafted call that is invalid (no such tool, arguments against
its schema) is rejected and the target writes the step; an invalid call the target
writes gets a message saying what is wrong, and the agent goes on.

For a model whose template has no tools (``tool_format="text"``), the calls are
text of the agent's own::

    Action: calculator({"expression": "48 / 2"})

parsed tolerantly (JSON arguments, ``name(key=value)`` or a single bare value;
anything else gets an observation saying how to write it) and answered with
``Observation: ...``. Either way the reasoner then continues the same chat, the
answer is the first ``\\boxed{}``.

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

from stepspec.engine.types import GenerationRequest, GenerationResult
from stepspec.orchestrator.prompts import Chat, message_text
from stepspec.orchestrator.reasoner import Reasoner
from stepspec.orchestrator.steps import TextCalls
from stepspec.orchestrator.trace import StepRecord, StopReason, Trace
from stepspec.workflows.agents.toolcalls import DEFAULT_TOOL_CALL_PARSER, Call, ToolCalling, assistant_message
from stepspec.workflows.agents.tools import Tool, as_tool

# Where a step starts a tool call (tolerant: "**Action**:", "action :", list markers).
ACTION_START = r"(?im)^[\s>*_`#\-\d.)]*action[\s*_`]*:[\s*_`]*[A-Za-z_]\w*\s*\("
_ACTION = re.compile(r"(?im)^[\s>*_`#\-\d.)]*action[\s*_`]*:[\s*_`]*([A-Za-z_]\w*)\s*\((.*)\)[\s*_`]*$")
OBSERVATION = "Observation:"

# The system prompt with the model's own tool format (the template lists the tools).
TOOLS_SYSTEM_PROMPT = """You solve the task step by step, one short step per paragraph.
Use the tools for every calculation: call one, then wait for its result.
When you know the final answer, write it as \\boxed{answer}."""
TOOL_FORMATS = ("auto", "template", "text")

DEFAULT_SYSTEM_PROMPT = """You solve the task step by step, one short step per paragraph.
You can use these tools:
{tools}
To use a tool, write a step that is only the call, for example:
Action: {example}
then stop: the result comes back as "Observation: ...". Use the tools for every calculation.
When you know the final answer, write it as \\boxed{{answer}}."""


# The same call (tool and arguments) made this many times ends the loop (stop reason "repeated_call").
REPEATS = 3


class AgentError(ValueError):
    """An agent was misconfigured (a duplicate tool name, no tools where some are needed)."""


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
    # "answer", "max_iterations", "repeated_call" (the same call a third time), or the last
    # trace's (eos, max_tokens, error, ...)
    stop_reason: str
    traces: tuple[Trace, ...]
    tool_calls: tuple[ToolCallRecord, ...]
    messages: tuple[tuple[str, str], ...] = field(default=())  # the whole chat, observations included
    # The agent's final reply: the answer step of its last turn, a turn that made no call (never
    # a call, an observation or the template's tool listing); None where the loop ended without
    # one, and stop_reason says why.
    output: str | None = None

    @property
    def num_iterations(self) -> int:
        return len(self.traces)


def parse_action(text: str, tools: dict[str, Tool]) -> Call | str:
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
    return Call.new(name, args)


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


def _key(call: Call) -> str:
    return f"{call.name}:{json.dumps(call.arguments, sort_keys=True, default=str)}"


class _DraftWatcher:
    """The draft engine as the agent sees it: every drafted step that calls a
    side-effect-free tool starts that call at once."""

    def __init__(self, engine: Any, agent: "Agent", started: dict[str, asyncio.Task],
                 calling: ToolCalling | None) -> None:
        self.engine, self.agent, self.started, self.calling = engine, agent, started, calling

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = await self.engine.generate(requests)
        for r in results:
            for c in r.completions:
                for call in self.agent.calls_in(c.text, self.calling):
                    key = _key(call)
                    if self.agent.tools[call.name].side_effect_free and key not in self.started:
                        self.started[key] = asyncio.ensure_future(self.agent.tools[call.name].call(call.arguments))
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class Agent:
    """A reasoner with tools, a system prompt and an iteration limit."""

    def __init__(self, reasoner: Reasoner, tools: Sequence[Any] = (), *, system_prompt: str | None = None,
                 max_iterations: int = 8, speculative_tools: bool = True,
                 demonstration: Sequence[Mapping[str, Any]] = (), tool_format: str = "auto",
                 tool_call_parser: str = DEFAULT_TOOL_CALL_PARSER) -> None:
        """``demonstration``: a worked exchange shown before the task, as chat turns
        (user task, assistant thoughts and calls, the calls' results, ...): small
        models follow a shown exchange far better than a described format.
        ``tool_format``: "template" (the model's own: its template renders the tools),
        "text" (``Action:`` lines) or "auto" (template where the model's template renders
        tools). ``tool_call_parser``: the vLLM tool parser that reads template calls."""
        if max_iterations < 1:
            raise AgentError(f"max_iterations must be >= 1, got {max_iterations}")
        if tool_format not in TOOL_FORMATS:
            raise AgentError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}, got {tool_format!r}")
        roles = [m.get("role") for m in demonstration]
        if any(r not in ("user", "assistant", "tool") for r in roles) or (roles and (roles[0] != "user"
                                                                                     or roles[-1] != "assistant")):
            raise AgentError("a demonstration is user/assistant (and tool) turns, opening with the user's task and "
                             "ending with the assistant's answer")
        self.demonstration = [dict(m) for m in demonstration]
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
        self.custom_prompt = system_prompt
        self.text_system_prompt = (system_prompt or DEFAULT_SYSTEM_PROMPT).replace("{tools}", listing) \
            .replace("{example}", example).replace("{{", "{").replace("}}", "}")
        self.max_iterations = max_iterations
        self.speculative_tools = speculative_tools
        self.tool_format, self.tool_call_parser = tool_format, tool_call_parser
        self.text_rules = replace(reasoner.rules, calls=TextCalls(ACTION_START, OBSERVATION))

    @property
    def system_prompt(self) -> str:
        """The system prompt of the text format (the template format's: :meth:`prompt`)."""
        return self.text_system_prompt

    async def format(self) -> str:
        """The tool format in use: "template" or "text" (for "auto": whether the target's template
        renders tools)."""
        if self.tool_format != "auto":
            return self.tool_format
        target, probe = self.reasoner.target, [{"role": "user", "content": "-"}]
        rendered = await target.aapply_chat_template(probe, tools=[t.openai() for t in self.tools.values()])
        return "template" if self.tools and rendered != await target.aapply_chat_template(probe) else "text"

    def prompt(self, template: bool) -> str:
        """The system prompt: the given one, else the format's default (tools listed in text only)."""
        if template:
            return (self.custom_prompt or TOOLS_SYSTEM_PROMPT).replace("{tools}", ", ".join(self.tools))
        return self.text_system_prompt

    def calls_in(self, text: str, calling: ToolCalling | None) -> list[Call]:
        """The calls of declared tools a drafted text makes, in the format in use."""
        if calling is None:
            if not re.search(ACTION_START, text):
                return []
            call = parse_action(text, self.tools)
            return [call] if isinstance(call, Call) else []
        if not calling.holds_call(text):
            return []
        parsed = calling.parse(text)
        return [c for c in parsed.calls if calling.check(c) is None]

    async def arun(self, task: str, on_step: Callable[[StepRecord], None] | None = None) -> AgentResult:
        if not task or not task.strip():
            raise ValueError("the task is empty; give the agent something to do")
        await self.reasoner.start()
        template = await self.format() == "template"
        calling = ToolCalling([t.openai() for t in self.tools.values()], self.tool_call_parser,
                              tokenizer=self.reasoner.target.tokenizer) if template else None
        rules = calling.rules(self.reasoner.rules) if calling is not None else self.text_rules
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.prompt(template)}, *self.demonstration,
                                          {"role": "user", "content": task}]
        shown = len(messages) - 1  # the messages before the task
        traces: list[Trace] = []
        records: list[ToolCallRecord] = []
        stop, output = "max_iterations", None
        seen: dict[str, list[ToolCallRecord]] = {}  # each call made (tool and arguments): its records
        for _ in range(self.max_iterations):
            started: dict[str, asyncio.Task] = {}
            draft = None
            if self.speculative_tools and self.reasoner.draft is not None:
                draft = _DraftWatcher(self.reasoner.draft, self, started, calling)
            try:
                question = Chat(task, messages, calling.rendered_tools if calling else ())
                solution = await self.reasoner.asolve(question, on_step, rules=rules, draft=draft)
                trace = solution.trace
                traces.append(trace)
                if trace.stop_reason != StopReason.ACTION:
                    stop, output = trace.stop_reason, trace.last_step_apart()[1]
                    messages.append({"role": "assistant", "content": trace.text})
                    break
                turn = await (self._template_turn(trace, calling, started, seen) if calling is not None
                              else self._text_turn(trace, started, seen))
                messages += turn.messages
                records += turn.records
                if turn.repeated:
                    stop = "repeated_call"
                    break
            finally:
                records.extend(await _discard(started))
        answer = next((t.answer for t in reversed(traces) if t.answer is not None), None)
        return AgentResult(task, answer, stop, tuple(traces), tuple(records),
                           tuple((m["role"], message_text(m)) for m in messages[:1] + messages[shown:]), output)

    async def _run(self, call: Call, started: dict[str, asyncio.Task], seen: dict[str, list[ToolCallRecord]]
                   ) -> ToolCallRecord:
        """``call`` run (or its speculative run, started from the draft's step, awaited). A call made
        before with the same arguments is not run again: its observation gives the earlier result
        and says so (``seen``: each call's records so far)."""
        key = _key(call)
        if key in seen:
            earlier = seen[key][0]
            record = replace(earlier, observation=f"{call.name} was called with these arguments before and "
                                                  f"returned: {earlier.observation}. Use that result; do not call "
                                                  "it again.", speculative=False, seconds=0.0)
        else:
            speculative = key in started  # the draft wrote this very call: it is running or done
            result = await (started.pop(key) if speculative else self.tools[call.name].call(call.arguments))
            record = ToolCallRecord(call.name, call.arguments, result.observation, result.ok, speculative, True,
                                    result.seconds, result.timed_out)
        seen.setdefault(key, []).append(record)
        return record

    async def _text_turn(self, trace: Trace, started: dict[str, asyncio.Task],
                         seen: dict[str, list[ToolCallRecord]]) -> "_Turn":
        call = parse_action(trace.steps[-1].text, self.tools)
        said = {"role": "assistant", "content": trace.text}
        if isinstance(call, str):
            return _Turn([said, {"role": "user", "content": f"{OBSERVATION} {call}"}], [])
        record = await self._run(call, started, seen)
        return _Turn([said, {"role": "user", "content": f"{OBSERVATION} {record.observation}"}], [record],
                     repeated=len(seen[_key(call)]) >= REPEATS)

    async def _template_turn(self, trace: Trace, calling: ToolCalling, started: dict[str, asyncio.Task],
                             seen: dict[str, list[ToolCallRecord]]) -> "_Turn":
        before, last = calling.apart(trace)
        parsed = calling.parse(last)
        if not parsed.calls or parsed.problems:
            problem = "; ".join(parsed.problems) or "no call could be read"
            return _Turn([{"role": "assistant", "content": trace.text},
                          {"role": "user", "content": f"That tool call is invalid: {problem}. Call a declared tool "
                                                      "with arguments that match its schema."}], [])
        said = assistant_message(parsed)
        said["content"] = "\n\n".join(t for t in (before, parsed.content or "") if t)
        calls = list(parsed.calls)
        records = [await self._run(call, started, seen) for call in calls]
        return _Turn([said, *({"role": "tool", "tool_call_id": c.id, "content": r.observation}
                              for c, r in zip(parsed.calls, records))], records,
                     repeated=any(len(seen[_key(call)]) >= REPEATS for call in calls))

    def run(self, task: str, on_step: Callable[[StepRecord], None] | None = None) -> AgentResult:
        return self.reasoner.run_sync(self.arun(task, on_step))


@dataclass(frozen=True)
class _Turn:
    """What one tool-calling turn adds: its messages (the assistant's, the results) and its calls."""

    messages: list[dict[str, Any]]
    records: list[ToolCallRecord]
    repeated: bool = False  # a call of it was made for the REPEATS-th time: the loop stops


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
