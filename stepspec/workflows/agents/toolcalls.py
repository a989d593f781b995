"""Tool calls in a model's text: declared as OpenAI function schemas, found and read by
vLLM's tool parsers, checked against the declared schemas.

One declaration serves every entry point: a tool is an OpenAI function schema
(``{"type": "function", "function": {"name", "description", "parameters"}}``), whether
a client sends it to ``stepspec serve``, a typed Python function derives it
(:meth:`stepspec.workflows.agents.tools.Tool.openai`) or an MCP server lists it.

A :class:`ToolCalling` is one trace's tool calling: the tools the template renders, the
parser that reads the calls (any name in vLLM's tool-parser registry; ``hermes_json``
by default, :mod:`stepspec.workflows.agents.tool_parser`), the request's ``tool_choice`` and
``parallel_tool_calls``. It is the trace's call rule
(:class:`stepspec.orchestrator.steps.CallRule`: a step holding a call ends the trace; a drafted
call that is invalid is rejected and the target writes the step; once a step opens a call,
whichever model writes it writes it bound to the declared schemas, so it names a declared tool
and its arguments follow that tool's schema) and reads the calls back (:meth:`ToolCalling.parse`).

*Bound* calls (vLLM's structured outputs, as vLLM's server binds forced ones): with tools
``add`` and ``multiply`` and the pair's fenced calls, the model writes freely until it writes
```` ```json ````; from there it can only write a JSON object ``{"name": "add", "arguments":
...}`` or the same for ``multiply``, its arguments those its schema allows, then the closing
fence. The grammar binds the call's structure, not its layout: the object compact or
pretty-printed over several lines, as the model writes it free (a bound call that opens compact
where the model would indent changes what it chooses inside). A bare call (no fence) is bound
from its compact head ``{"name": "``, the only layout its trigger sees; so is every call where
the guidance asks for a call per item (``guidance`` with several calls allowed), the layout
after which the pair goes on to its next call. A forced reply is bound from its first token
(the named function's arguments; ``required``: any declared call's object).

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

from stepspec.common.names import did_you_mean
from stepspec.engine.types import Structured
from stepspec.orchestrator.steps import CallRule, StepRules, opens_call
from stepspec.orchestrator.trace import Trace, join_steps

DEFAULT_TOOL_CALL_PARSER = "hermes_json"
# Where a call's result would begin if a model went on to write it itself: generation stops there.
RESULT_START = "<tool_response>"
# What a served request's system message says of calls where the model may choose (tool_choice
# auto): write a call per item asked for (with parallel_tool_calls), and no call when none fits.
# The chat template renders the tools after it. Chosen on BFCL entries that are not reported.
SEVERAL_CALLS = ("When a request needs a function called more than once (for several values, items or cases), write "
                 "one call for each, one after another, each call in its own block, before you end your turn.")
NO_FITTING_CALL = "When no function fits the request, do not call one: say so in text."
GUIDED_SYSTEM = "You are a helpful assistant."  # the system message guidance opens where a request sends none
NAME_KEY, ARGUMENTS_KEY = '{"name": "', '", "arguments": '  # a call's object up to its name, then to its arguments
# The same in any layout (whitespace where JSON allows it): what a bound call's grammar writes around its name.
NAME_KEY_RE, ARGUMENTS_KEY_RE = r'\{\s*"name"\s*:\s*"', r'"\s*,\s*"arguments"\s*:\s*'


@dataclass(frozen=True)
class CallFormat:
    """How a call is written in a model's text: ``opening``, then the object
    ``{"name": ..., "arguments": ...}``, then ``closing``."""

    opening: str
    closing: str

    @property
    def trigger(self) -> str:
        """Where the structural tag starts binding: the opening without its newline (a bare call's:
        ``{"name"``)."""
        return self.opening.rstrip("\n") or NAME_KEY.removesuffix(': "')

    def head(self, name: str) -> str:
        """The text up to a call's arguments, for the tool ``name``."""
        return f"{self.opening}{NAME_KEY}{name}{ARGUMENTS_KEY}"

    def tags(self, schemas: Mapping[str, Mapping[str, Any]], compact: bool = False) -> list[dict[str, Any]]:
        """A structural tag's tags for calls to the tools ``schemas`` (name: parameters) in this
        format: after an opening, the whole object in any JSON layout (:func:`calls_schema`); a
        bare call, or any call where ``compact``, from its compact head (:meth:`head`), one tag per
        tool with its arguments' schema."""
        if self.opening and not compact:
            return [{"type": "tag", "begin": self.opening, "end": self.closing,
                     "content": {"type": "json_schema", "json_schema": calls_schema(schemas)}}]
        return [{"type": "tag", "begin": self.head(name), "end": "}" + self.closing,
                 "content": {"type": "json_schema", "json_schema": dict(parameters)}}
                for name, parameters in schemas.items()]

    def head_re(self, names: Sequence[str]) -> str:
        """A regex of a call's head in this format: after an opening in any JSON layout (so the compact
        head a ``compact`` binding writes too), a bare call's compact only; groups ``name`` (one of
        ``names``) and ``arguments`` (the text after the name up to the arguments)."""
        name_key, arguments_key = (NAME_KEY_RE, ARGUMENTS_KEY_RE) if self.opening else \
            (re.escape(NAME_KEY), re.escape(ARGUMENTS_KEY))
        return (f"{re.escape(self.opening)}{name_key}(?P<name>{'|'.join(map(re.escape, names))})"
                f"(?P<arguments>{arguments_key})")


def calls_schema(schemas: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON schema of a call's object ``{"name": ..., "arguments": ...}`` to any of the tools
    ``schemas`` (name: parameters): the name one of theirs, the arguments that tool's."""
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": name}, "arguments": dict(parameters)},
                       "required": ["name", "arguments"], "additionalProperties": False}
                      for name, parameters in schemas.items()]}


FENCE = CallFormat("```json\n", "\n```")  # what the bundled pair writes
TAG = CallFormat("<tool_call>\n", "\n</tool_call>")  # what Qwen2.5's template asks for
# The call formats of the parsers stepspec can constrain and force, the first the one a forced call opens with.
BARE = CallFormat("", "")  # the object alone, as the pair writes a call now and then
CALL_FORMATS = {"hermes_json": (FENCE, TAG, BARE), "hermes": (TAG,)}


class ToolCallError(ValueError):
    """A tool declaration, a tool choice or a parser name that cannot be used; the message
    says which and how to fix it."""


@dataclass(frozen=True)
class Call:
    """One tool call read from a model's text: ``arguments`` as an object."""

    id: str
    name: str
    arguments: dict[str, Any]

    @classmethod
    def new(cls, name: str, arguments: dict[str, Any]) -> "Call":
        """A call with a fresh id, as OpenAI's API writes them."""
        return cls(f"call_{uuid.uuid4().hex[:24]}", name, arguments)

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
    """The tool parser registered in vLLM under ``name``: vLLM's own, or a plug-in's (stepspec's
    ``hermes_json``, :mod:`stepspec.workflows.agents.parsers`), loaded the way vLLM loads plug-ins."""
    from vllm.plugins import load_general_plugins
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    load_general_plugins()  # once per process; a process that started an engine has already
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


def call_formats(name: str, cls: type | None = None) -> tuple[CallFormat, ...]:
    """How the calls of the parser ``name`` (its class ``cls``, looked up if not given) open, as far
    as stepspec knows (``CALL_FORMATS``, or a parser whose calls open with ``<tool_call>``); ()
    where it does not."""
    if name in CALL_FORMATS:
        return CALL_FORMATS[name]
    start = getattr(cls or parser_class(name), "tool_call_start_token", "")
    return CALL_FORMATS["hermes"] if start == "<tool_call>" else ()


def check_bindable(name: str, formats: Sequence[CallFormat] | None = None) -> None:
    """That calls read by the parser ``name`` (opening in ``formats``, looked up if not given) can
    be bound to their schemas; else a :class:`ToolCallError`."""
    if not (call_formats(name) if formats is None else formats):
        raise ToolCallError(f"stepspec cannot bind calls to their schemas with parser '{name}' (it knows how calls "
                            f"open for {', '.join(CALL_FORMATS)}); use one of those, or turn the binding off "
                            "(constrained_calls false)")


def parser_table() -> str:
    """The tool-call parsers as a markdown table (the docs' table): the parsers stepspec can bind
    and force calls of (``CALL_FORMATS``), which registers each, how its calls open, then any other
    parser of vLLM's registry."""
    from stepspec.workflows.agents.parsers import PARSERS

    rows = ["| parser | registered by | calls open with | bound to the schemas, forced choices |",
            "|---|---|---|---|"]
    for name, formats in CALL_FORMATS.items():
        default = " (the default)" if name == DEFAULT_TOOL_CALL_PARSER else ""
        opens = ", ".join(f"`` {f.trigger} ``" for f in formats)
        rows.append(f"| `{name}`{default} | {'stepspec (a vLLM plug-in)' if name in PARSERS else 'vLLM'} | {opens} "
                    "| yes |")
    rows.append("| any other name in vLLM's registry | vLLM | its own | as `hermes` where they open with "
                "`<tool_call>`; else no: calls read after they are written, `tool_choice` `auto` only |")
    return "\n".join(rows) + "\n"


Choice = Literal["auto", "none", "required"] | str  # or a function's name


class ToolCalling(CallRule):
    """One trace's tool calling: the declared tools, how calls are read, what the request allows;
    the trace's :class:`~stepspec.orchestrator.steps.CallRule`.

    ``choice``: ``auto`` (the model may call), ``none`` (no tools rendered, no call read),
    ``required`` (the reply is a call) or a function's name (the reply is a call of it);
    a forced call's opening is the trace's :attr:`prefill`. ``parallel``: False keeps the
    first call of a step that writes several. ``constrained``: whether calls are generated
    bound to the declared schemas (:attr:`constraint`, vLLM's structured outputs); None: where
    stepspec knows how the parser's calls open (``CALL_FORMATS``), True: there or an error."""

    stop = RESULT_START

    def __init__(self, tools: Sequence[Mapping[str, Any]], parser: str = DEFAULT_TOOL_CALL_PARSER,
                 tokenizer: Any = None, choice: Choice = "auto", parallel: bool = True,
                 constrained: bool | None = None, guidance: bool = False) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        self.tools = check_tools(tools)
        self.schemas = {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}
        check_choice(choice, list(self.schemas))
        self.choice, self.parallel, self.parser_name, self.guidance = choice, parallel, parser, guidance
        cls = parser_class(parser)
        formats = call_formats(parser, cls)
        if constrained is True and choice != "none":
            check_bindable(parser, formats)
        if tokenizer is None:
            raise ToolCallError("tool calling needs the model's tokenizer on this machine (the parser is built with "
                                "it); give the engine a tokenizer")
        self.parser = cls(tokenizer, None)
        self.forced = choice not in ("auto", "none")
        self.start = r"(?s)." if self.forced else call_start(parser, cls)  # forced: every step continues the call
        self.prefill = ""
        if self.forced:
            if not formats:
                raise ToolCallError(f"tool_choice '{choice}' forces a call, and stepspec knows no call opening for "
                                    f"parser '{parser}'; use tool_choice 'auto' or parser {DEFAULT_TOOL_CALL_PARSER}")
            self.prefill = formats[0].opening if choice == "required" else formats[0].head(choice)
        # Where the guidance asks for a call per item, calls are bound from their compact head: the layout
        # after which the pair goes on to the next call.
        self.compact = guidance and self.several
        bound = constrained is not False and choice != "none" and bool(formats)
        self.formats = tuple(formats) if bound else ()
        self.constraint = self._constraint(formats) if bound else None
        self._request = ChatCompletionRequest(model="stepspec", messages=[{"role": "user", "content": "-"}],
                                              tools=self.tools or None)

    def _constraint(self, formats: Sequence[CallFormat]) -> Structured:
        """The calls bound to the declared schemas (vLLM's structured outputs): a forced reply's JSON
        (the named function's arguments; ``required``: any declared call), else, once the model
        opens a call in any of the parser's ``formats``, a call to a declared tool whose arguments
        follow its schema (a structural tag: free text around the calls)."""
        if self.forced:
            if self.choice != "required":
                return Structured(json=json.dumps(self.schemas[self.choice]))
            return Structured(json=json.dumps(calls_schema(self.schemas)))
        tag = {"type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": [f.trigger for f in formats],
            "tags": [t for f in formats for t in f.tags(self.schemas, compact=self.compact)]}}
        return Structured(structural_tag=json.dumps(tag))

    def guided(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with the call guidance in their system message (``guidance``, ``tool_choice``
        auto): :data:`SEVERAL_CALLS` where several calls are allowed, then :data:`NO_FITTING_CALL`;
        a system message opens the chat where there is none. Every turn of a conversation alike, so
        that the next turn's prompt continues the last one's (the prefix cache holds it). Example:
        [user "Weather in Paris and Rome?"] becomes [system "You are a helpful assistant. When a
        request needs a function called more than once ...", user ...]."""
        out = [dict(m) for m in messages]
        if not self.guidance or self.choice != "auto":
            return out
        said = " ".join(([SEVERAL_CALLS] if self.several else []) + [NO_FITTING_CALL])
        if out and out[0].get("role") == "system":
            content = out[0].get("content") or ""
            out[0]["content"] = (content + [{"type": "text", "text": said}] if isinstance(content, list)
                                 else f"{content}\n\n{said}" if content else said)
        else:
            out.insert(0, {"role": "system", "content": f"{GUIDED_SYSTEM} {said}"})
        return out

    @property
    def rendered_tools(self) -> list[dict[str, Any]]:
        """The tools the template renders (none for ``tool_choice: none``; the named one only)."""
        if self.choice == "none":
            return []
        return [t for t in self.tools if not self.forced or self.choice == "required"
                or t["function"]["name"] == self.choice]

    @property
    def several(self) -> bool:
        """With ``parallel`` the model may write several calls a turn, a step each (a forced call is one)."""
        return self.parallel and not self.forced

    def rules(self, base: StepRules) -> StepRules:
        """``base`` with this call rule: the turn's calls end the trace, invalid drafted calls are
        rejected (``tool_choice: none``: ``base``, no call is read)."""
        return base if self.choice == "none" else replace(base, calls=self)

    def holds_call(self, text: str) -> bool:
        """Whether ``text`` holds (the beginning of) a call."""
        return opens_call(self, text)

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
        """The calls ``text`` holds (after the forced opening, if any), each checked, up to the first
        that repeats one before it (:meth:`repeated`)."""
        content, calls = self._read(text)
        calls = calls[:_first_repeat(calls)]
        if not self.parallel:
            calls = calls[:1]
        problems = tuple(p for c in calls if (p := self.check(c)) is not None)
        return Parsed(content, calls, problems)

    def repeated(self, text: str) -> bool:
        """Whether ``text`` writes a call twice, the same tool with the same arguments
        (:meth:`CallRule.repeated`). Example: a bare ``{"name": "multiply", "arguments": {"a": 2,
        "b": 3}}`` line written again and again: the turn ends, one call returned."""
        _, calls = self._read(text)
        return _first_repeat(calls) < len(calls)

    def _read(self, text: str) -> tuple[str | None, tuple[Call, ...]]:
        """(the content, every call ``text`` holds as written)."""
        if self.forced:
            calls = self.forced_call(text)
            return (None if calls else text), calls
        out = self.parser.extract_tool_calls(text, self._request)
        calls = tuple(Call.new(c.function.name, json.loads(c.function.arguments or "{}"))
                      for c in (out.tool_calls if out.tools_called else ()))
        return (out.content if out.tools_called else text), calls

    def forced_call(self, text: str) -> tuple[Call, ...]:
        """The call a forced reply makes, read as vLLM's server reads one: the reply's first JSON
        value, read to its own end (what follows it, the closing brace and fence, is not read). A
        named function's opening is prefilled up to its arguments, so that value is the arguments;
        ``required``'s opening ends before the call's object, so that value is the object.
        Example, tool_choice multiply: ``{"a": 12, "b": 13}}\n```\n`` is multiply(a=12, b=13)."""
        try:
            value, _ = json.JSONDecoder().raw_decode(text.lstrip())
        except json.JSONDecodeError:
            return ()
        if self.choice != "required":
            return (Call.new(self.choice, value),) if isinstance(value, dict) else ()
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return ()
        arguments = value.get("arguments", value.get("parameters", {}))
        return (Call.new(value["name"], arguments),) if isinstance(arguments, dict) else ()

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

    def forced_spans(self, text: str) -> tuple[tuple[int, int], ...]:
        """The spans of ``text`` the binding wrote itself (:meth:`CallRule.forced_spans`): after each call's
        opening (the structural tag's trigger, e.g. ```` ```json ````) the rest of the call's head,
        ``\\n{"name": "``, and after the name ``", "arguments": `` (with the whitespace the model chose
        between them, compact or pretty-printed); the name too where one tool is declared. Bound
        ``tool_choice: auto`` calls only (a forced reply starts after its prefill). Example, one tool
        ``add``: in ``"I add.\\n```json\\n{"name": "add", "arguments": {"a": 1}}"`` the span
        from the newline after ``json`` to the space before ``{"a"``."""
        if not self.formats or self.forced:
            return ()
        spans = []
        names = sorted(self.schemas, key=len, reverse=True)  # the longest declared name that is written
        for f in self.formats:
            for m in re.finditer(f.head_re(names), text):
                start = m.start() + len(f.trigger)
                if len(self.schemas) == 1:
                    spans.append((start, m.end()))
                else:
                    spans += [(start, m.start("name")), m.span("arguments")]
        # a fenced call's object also reads as a bare one: keep the spans no other holds
        return tuple(sorted({s for s in spans if not any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans)}))

    def problem(self, text: str) -> str | None:
        """Why the call(s) in ``text`` are invalid (:meth:`CallRule.problem`), or None."""
        return self.why_invalid(self.parse(text))

    def why_invalid(self, parsed: Parsed) -> str | None:
        """Why the calls ``parsed`` holds are invalid (none could be read, or each one's problem), or None."""
        if not parsed.calls:
            return f"a call begins but none can be read (parser '{self.parser_name}': is its JSON complete?)"
        return "; ".join(parsed.problems) or None


def _first_repeat(calls: Sequence[Call]) -> int:
    """The index of the first call that repeats an earlier one (name and arguments), or len(calls)."""
    seen = set()
    for i, c in enumerate(calls):
        key = (c.name, json.dumps(c.arguments, sort_keys=True))
        if key in seen:
            return i
        seen.add(key)
    return len(calls)


def assistant_message(parsed: Parsed) -> dict[str, Any]:
    """The assistant's turn that made ``parsed``'s calls, as the next request's history
    holds it (the template reads ``arguments`` as an object)."""
    return {"role": "assistant", "content": parsed.content or "",
            "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in parsed.calls]}
