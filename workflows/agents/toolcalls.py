"""Tool calls in a model's text: declared as OpenAI function schemas, found and read by
vLLM's tool parsers, checked against the declared schemas.

One declaration serves every entry point: a tool is an OpenAI function schema
(``{"type": "function", "function": {"name", "description", "parameters"}}``), whether
a client sends it to ``stepspec serve``, a typed Python function derives it
(:meth:`workflows.agents.tools.Tool.openai`) or an MCP server lists it.

A :class:`ToolCalling` is one trace's tool calling: the tools the template renders, the
parser that reads the calls (any name in vLLM's tool-parser registry; ``hermes_json``
by default, :mod:`workflows.agents.tool_parser`), the request's ``tool_choice`` and
``parallel_tool_calls``. It gives the trace its :class:`StepRules` (a step holding a
call ends the trace; a drafted call that is invalid is rejected and the target writes
the step) and reads the calls back (:meth:`ToolCalling.parse`).

Terms: a call is *invalid* when it names no declared tool, its arguments break the
tool's JSON schema, it is not the function ``tool_choice`` names, or it cannot be read
at all (a call's opening with no parsable JSON after it).

Worked example: with ``multiply(a: int, b: int)`` declared, the text ``"```json\\n{"name":
"multiply", "arguments": {"a": 3}}\\n```"`` parses to one call with the problem
``multiply: 'b' is a required property``; a drafted step holding it is rejected.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping, Sequence

from common.names import did_you_mean
from orchestrator.steps import StepRules
from orchestrator.trace import Trace, join_steps

DEFAULT_TOOL_CALL_PARSER = "hermes_json"
OWN_PARSERS = {"hermes_json": ("workflows.agents.tool_parser", "HermesJsonToolParser")}
# Where a call's result would begin if a model went on to write it itself: generation stops there.
RESULT_START = "<tool_response>"
# The opening of a call a request forces (tool_choice "required" or a named function), per
# how the parser reads calls: the pair's fenced JSON, or hermes tags.
FORCED_HEADS = {"hermes_json": '```json\n{"name": "', "<tool_call>": '<tool_call>\n{"name": "'}


# After tool_choice "required"'s opening: the function's name, then the arguments' key.
FORCED_NAME = re.compile(r'\s*([A-Za-z0-9_.\-]{1,64})"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class ToolCallError(ValueError):
    """A tool declaration, a tool choice or a parser name that cannot be used; the message
    says which and how to fix it."""


@dataclass(frozen=True)
class Call:
    """One tool call read from a model's text: ``arguments`` as an object."""

    id: str
    name: str
    arguments: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """As an assistant message's ``tool_calls`` entry (``arguments`` a JSON string)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass(frozen=True)
class Parsed:
    """What a text holds: its content outside the calls, the calls, and each invalid call's problem."""

    content: str | None
    calls: tuple[Call, ...]
    problems: tuple[str, ...] = ()


def _call(name: str, arguments: dict[str, Any]) -> Call:
    return Call(f"call_{uuid.uuid4().hex[:24]}", name, arguments)


def check_tools(tools: Sequence[Any], where: str = "tools") -> list[dict[str, Any]]:
    """``tools`` as OpenAI function schemas, each checked: ``type`` "function", a name, names
    unique, ``parameters`` a JSON schema (of an object). Raises :class:`ToolCallError` naming
    the entry and the fix."""
    from jsonschema import SchemaError, validators

    out, names = [], set()
    for i, t in enumerate(tools):
        at = f"{where}[{i}]"
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" or \
                not isinstance(t.get("function"), Mapping):
            raise ToolCallError(f"{at}: a tool is {{'type': 'function', 'function': {{'name': ..., 'parameters': "
                                "{...JSON schema...}}}}")
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ToolCallError(f"{at}.function.name: {name!r} is not a function name (letters, digits, _ . -; "
                                "at most 64)")
        if name in names:
            raise ToolCallError(f"{at}.function.name: two tools are named '{name}'; give each tool its own name")
        names.add(name)
        parameters = f.get("parameters", {"type": "object", "properties": {}})
        try:
            if not isinstance(parameters, Mapping):
                raise SchemaError(f"{type(parameters).__name__} is not an object")
            validators.validator_for(parameters).check_schema(parameters)
        except SchemaError as e:
            raise ToolCallError(f"{at}.function.parameters: not a JSON schema ({getattr(e, 'message', e)}); give "
                                "the arguments' schema, e.g. {'type': 'object', 'properties': {'a': {'type': "
                                "'integer'}}, 'required': ['a']}") from None
        out.append({"type": "function", "function": {**f, "parameters": dict(parameters)}})
    return out


def check_choice(choice: str, names: Sequence[str]) -> None:
    """``tool_choice`` checked against the declared tools' ``names``: "auto" and "none" always
    do, "required" and a function's name need tools, a name must be one of them."""
    if choice in ("auto", "none"):
        return
    if not names:
        raise ToolCallError(f"tool_choice {choice!r} needs tools; declare them in 'tools'")
    if choice != "required" and choice not in names:
        raise ToolCallError(f"tool_choice names function {choice!r}, which is not among the tools (declared: "
                            f"{', '.join(names)}).{did_you_mean(str(choice), names)}")


def parser_class(name: str) -> type:
    """The tool parser registered in vLLM under ``name`` (``hermes_json`` is registered here)."""
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    for own, (module, cls) in OWN_PARSERS.items():
        if own not in ToolParserManager.tool_parsers and own not in ToolParserManager.lazy_parsers:
            ToolParserManager.register_lazy_module(own, module, cls)
    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        known = sorted({*ToolParserManager.tool_parsers, *ToolParserManager.lazy_parsers})
        raise ToolCallError(f"unknown tool-call parser '{name}'.{did_you_mean(name, known)} vLLM's registry has "
                            f"{', '.join(known)}") from None


def call_start(name: str, cls: type) -> str:
    """The regex where a call begins in text ``cls`` (the parser registered as ``name``) reads."""
    own = getattr(cls, "call_start", None)
    if own:
        return own
    token = getattr(cls, "tool_call_start_token", None) or getattr(cls, "bot_token", None)
    if isinstance(token, str) and token:
        return re.escape(token)
    raise ToolCallError(f"tool-call parser '{name}': stepspec cannot tell where its calls begin (it names no start "
                        f"token); use {DEFAULT_TOOL_CALL_PARSER} or hermes")


Choice = Literal["auto", "none", "required"] | str  # or a function's name


class ToolCalling:
    """One trace's tool calling: the declared tools, how calls are read, what the request allows.

    ``choice``: ``auto`` (the model may call), ``none`` (no tools rendered, no call read),
    ``required`` (the reply is a call) or a function's name (the reply is a call of it);
    a forced call's opening is the trace's :attr:`prefill`. ``parallel``: False keeps the
    first call of a step that writes several."""

    def __init__(self, tools: Sequence[Mapping[str, Any]], parser: str = DEFAULT_TOOL_CALL_PARSER,
                 tokenizer: Any = None, choice: Choice = "auto", parallel: bool = True) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        self.tools = check_tools(tools)
        self.schemas = {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}
        check_choice(choice, list(self.schemas))
        self.choice, self.parallel, self.parser_name = choice, parallel, parser
        cls = parser_class(parser)
        if tokenizer is None:
            raise ToolCallError("tool calling needs the model's tokenizer on this machine (the parser is built with "
                                "it); give the engine a tokenizer")
        self.parser = cls(tokenizer, None)
        self.forced = choice not in ("auto", "none")
        self.start = r"(?s)." if self.forced else call_start(parser, cls)  # forced: every step continues the call
        self.prefill = ""
        if self.forced:
            head = FORCED_HEADS.get(parser) or FORCED_HEADS.get(getattr(cls, "tool_call_start_token", ""))
            if head is None:
                raise ToolCallError(f"tool_choice '{choice}' forces a call, and stepspec knows no call opening for "
                                    f"parser '{parser}'; use tool_choice 'auto' or parser {DEFAULT_TOOL_CALL_PARSER}")
            self.prefill = head + (f'{choice}", "arguments": ' if choice != "required" else "")
        self._request = ChatCompletionRequest(model="stepspec", messages=[{"role": "user", "content": "-"}],
                                              tools=self.tools or None)

    @property
    def rendered_tools(self) -> list[dict[str, Any]]:
        """The tools the template renders (none for ``tool_choice: none``; the named one only)."""
        if self.choice == "none":
            return []
        return [t for t in self.tools if not self.forced or self.choice == "required"
                or t["function"]["name"] == self.choice]

    def rules(self, base: StepRules) -> StepRules:
        """``base`` with the turn's calls ending the trace, and invalid drafted calls rejected. With
        ``parallel`` the model may write several calls a turn, a step each (a forced call is one)."""
        if self.choice == "none":
            return base
        return replace(base, action_pattern=self.start, action_stop=RESULT_START, action_check=self.problem,
                       several_calls=self.parallel and not self.forced)

    def holds_call(self, text: str) -> bool:
        """Whether ``text`` holds (the beginning of) a call."""
        return re.search(self.start, text) is not None

    def apart(self, trace: Trace) -> tuple[str, str]:
        """(the steps before the first that holds a call; that step and every one after it): a
        turn's reasoning and the text its calls are read from. Example: "I add, then multiply.",
        a call to add, a call to multiply: the first step, and the two calls' steps."""
        steps = trace.whole_steps()
        texts = [join_steps(step, trace.delimiter) for step in steps]
        first = next((i for i, text in enumerate(texts) if self.holds_call(text)), max(len(steps) - 1, 0))
        return (join_steps([r for step in steps[:first] for r in step], trace.delimiter),
                join_steps([r for step in steps[first:] for r in step], trace.delimiter))

    def parse(self, text: str) -> Parsed:
        """The calls ``text`` holds (after the forced opening, if any), each checked."""
        if self.forced:
            calls = self.forced_call(text)
            content = None if calls else text
        else:
            out = self.parser.extract_tool_calls(text, self._request)
            calls = tuple(_call(c.function.name, json.loads(c.function.arguments or "{}"))
                          for c in (out.tool_calls if out.tools_called else ()))
            content = out.content if out.tools_called else text
        if not self.parallel:
            calls = calls[:1]
        problems = tuple(p for c in calls if (p := self.check(c)) is not None)
        return Parsed(content, calls, problems)

    def forced_call(self, text: str) -> tuple[Call, ...]:
        """The call a forced reply makes: the prefilled opening names the function (``required``:
        the reply begins with its name) and the reply's first JSON value after ``"arguments":``
        is its arguments, read to its own end, as vLLM's server reads a forced call's arguments;
        what follows it (the call's closing brace and fence, or a brace too few) is not read.
        Example, tool_choice multiply: ``{"a": 12, "b": 13}\n```\n`` is multiply(a=12, b=13)."""
        name, rest = self.choice, text
        if self.choice == "required":
            m = FORCED_NAME.match(text)
            if m is None:
                return ()
            name, rest = m.group(1), text[m.end():]
        try:
            arguments, _ = json.JSONDecoder().raw_decode(rest.lstrip())
        except json.JSONDecodeError:
            return ()
        return (_call(name, arguments),) if isinstance(arguments, dict) else ()

    def check(self, call: Call) -> str | None:
        """Why ``call`` is invalid, or None."""
        from jsonschema import validators

        if call.name not in self.schemas:
            return (f"'{call.name}' is not a declared tool (declared: {', '.join(self.schemas)})."
                    f"{did_you_mean(call.name, self.schemas)}")
        if self.forced and self.choice != "required" and call.name != self.choice:
            return f"tool_choice asks for '{self.choice}', the call is to '{call.name}'"
        schema = self.schemas[call.name]
        errors = sorted(validators.validator_for(schema)(schema).iter_errors(call.arguments), key=lambda e: e.path)
        if errors:
            where = ".".join(str(p) for p in errors[0].absolute_path)
            return f"{call.name}: {f'{where}: ' if where else ''}{errors[0].message}"
        return None

    def problem(self, text: str) -> str | None:
        """Why the call(s) in ``text`` are invalid (``StepRules.action_check``), or None."""
        parsed = self.parse(text)
        if not parsed.calls:
            return f"a call begins but none can be read (parser '{self.parser_name}': is its JSON complete?)"
        return "; ".join(parsed.problems) or None


def assistant_message(parsed: Parsed) -> dict[str, Any]:
    """The assistant's turn that made ``parsed``'s calls, as the next request's history
    holds it (the template reads ``arguments`` as an object)."""
    return {"role": "assistant", "content": parsed.content or "",
            "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in parsed.calls]}
