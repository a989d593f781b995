"""What a request to ``stepspec serve`` may ask, checked before any model works on it.

The bodies are OpenAI's (``/v1/chat/completions``, ``/v1/completions``), validated by
vLLM's own request models (the same checks vLLM's server makes: types, ranges, message
shapes). stepspec reads the parameters that have a meaning for a reasoning trace and
refuses the rest by name, with a 400 (:class:`RequestError`):

* ``max_tokens`` / ``max_completion_tokens``: the trace's token budget.
* ``temperature``: 0 (or absent) for the strategies that decode greedily; the sampling
  temperature of those that sample (``tree``, ``best-of-n``: their ``temperature`` option).
* ``seed``: the seed option of the strategies that sample; greedy ones are deterministic.
* ``stop``: the answer is cut at the first stop string.
* ``n``: 1. ``stream``, ``stream_options.include_usage``; ``user`` and ``store`` are accepted and
  unused (nothing is stored).
* ``tools``, ``tool_choice``, ``parallel_tool_calls``: tool calling (:class:`ToolRequest`);
  the conversation may hold an assistant's ``tool_calls`` and ``tool`` messages answering
  them by ``tool_call_id``, and may end with them.
* ``stepspec`` (the openai SDK's ``extra_body={"stepspec": {...}}``): the strategy, its
  options, the judge and its options, the budget (:class:`StepspecOptions`), checked by
  the same declarations every entry point uses.

Worked example: ``{"model": "specreason", "messages": [...], "max_tokens": 512,
"stepspec": {"strategy": "tree", "options": {"k": 3}}}`` solves with ``tree`` (k=3) on
the served reasoner's engines with a 512-token budget; ``"top_p": 0.9`` instead is a 400
naming ``top_p`` as unsupported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stepspec.common.names import did_you_mean
from stepspec.common.options import explain
from stepspec.orchestrator.prompts import ANSWERABLE_ROLES, Chat, RawPrompt
from stepspec.workflows.agents.toolcalls import ToolCallError, check_choice, check_tools

# The OpenAI parameters a trace gives a meaning to (the rest: a 400 naming them).
CHAT_PARAMETERS = {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                   "temperature", "stop", "seed", "n", "user", "store", "tools", "tool_choice",
                   "parallel_tool_calls"}
COMPLETION_PARAMETERS = {"model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "stop", "seed",
                         "n", "user"}
EXTENSION = "stepspec"


class RequestError(Exception):
    """A request the server refuses: the HTTP status, what is wrong and how to fix it, and
    the parameter it concerns (OpenAI's error ``param``)."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


class StepspecOptions(BaseModel):
    """The request's ``stepspec`` object: what this request's trace does differently from
    the served reasoner's configuration. Names are checked by the reasoner's own
    declarations (an unknown strategy, option or judge is a 400 with the closest name)."""

    model_config = ConfigDict(extra="forbid")

    strategy: str | None = Field(None, description="Another strategy on the same engines.")
    options: dict[str, Any] = Field(default_factory=dict, description="Strategy options (k, gamma, ...).")
    judge: str | None = Field(None, description="Another judge.")
    judge_options: dict[str, Any] = Field(default_factory=dict, description="The judge's options.")
    budget: dict[str, Any] = Field(default_factory=dict, description="Budget fields (max_steps, max_seconds, ...).")


@dataclass(frozen=True)
class ToolRequest:
    """A request's tools (OpenAI function schemas, checked), ``tool_choice`` ("auto",
    "none", "required" or a function's name) and ``parallel_tool_calls``."""

    tools: tuple[dict[str, Any], ...]
    choice: str = "auto"
    parallel: bool = True


@dataclass(frozen=True)
class TraceRequest:
    """A checked request: the question (a :class:`Chat` for a conversation, a
    :class:`RawPrompt` for a completion), and what the trace does differently from the
    served reasoner. ``tools``: the request's tool calling, None without tools."""

    kind: Literal["chat", "completion"]
    model: str | None
    question: str
    tools: ToolRequest | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature / seed, as given
    extension: StepspecOptions = field(default_factory=StepspecOptions)


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying where it is malformed."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the request body is not valid JSON ({e}); send a JSON object with "
                                "Content-Type: application/json") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _refused(model: type, e: ValidationError, owner: str, param_prefix: str = "") -> RequestError:
    """A 400 wording the first mistake as every options model does (:func:`stepspec.common.options.explain`)."""
    loc = e.errors()[0]["loc"]
    param = f"{param_prefix}{loc[0]}" if loc else param_prefix.rstrip(".") or None
    return RequestError(400, explain(model, e, owner), param)


def _refuse_unsupported(body: Mapping[str, Any], supported: set[str], known: set[str]) -> None:
    for key, value in body.items():
        if key in supported or key == EXTENSION:
            continue
        if key in known:
            if value is None or value is False or value == [] or value == {}:
                continue  # a default spelled out
            raise RequestError(400, f"'{key}' is not supported by stepspec serve (a reasoning trace has no meaning "
                                    f"for it); leave it out. Supported: {', '.join(sorted(supported))}", key)
        raise RequestError(400, f"unknown parameter '{key}'{did_you_mean(key, sorted(known | {EXTENSION}))}", key)


def _extension(body: Mapping[str, Any]) -> StepspecOptions:
    try:
        return StepspecOptions.model_validate(body.get(EXTENSION) or {})
    except ValidationError as e:
        raise _refused(StepspecOptions, e, EXTENSION, f"{EXTENSION}.") from None


def _common(body: Mapping[str, Any], request: Any) -> dict[str, Any]:
    if (request.n or 1) != 1:
        raise RequestError(400, f"n={request.n}: stepspec serve writes one trace per request; send n=1 (or several "
                                "requests)", "n")
    stop = request.stop or ()
    sampling = {k: body[k] for k in ("temperature", "seed") if body.get(k) is not None}
    options = request.stream_options
    return dict(model=request.model, stream=bool(request.stream),
                include_usage=bool(options and options.include_usage),
                stop=(stop,) if isinstance(stop, str) else tuple(stop), sampling=sampling,
                extension=_extension(body))


def parse_chat(body: Mapping[str, Any]) -> TraceRequest:
    """A ``/v1/chat/completions`` body, checked (vLLM's ChatCompletionRequest, then the
    parameters above)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    if "messages" not in body:
        raise RequestError(400, "'messages' is required: the conversation to answer, e.g. "
                                '[{"role": "user", "content": "What is 12 * 13?"}]', "messages")
    _refuse_unsupported(body, CHAT_PARAMETERS, set(ChatCompletionRequest.model_fields))
    tools = _tools(body)  # before vLLM's checks: these name the tool and the fix
    try:
        request = ChatCompletionRequest.model_validate({k: v for k, v in body.items() if k != EXTENSION})
    except ValidationError as e:
        raise _refused(ChatCompletionRequest, e, "the request body") from None
    messages = _messages(body["messages"])
    if not messages or messages[-1]["role"] not in ANSWERABLE_ROLES:
        raise RequestError(400, "the last message must be the user's (or a tool's result): the trace is the "
                                "assistant's answer to it", "messages")
    users = [m for m in messages if m["role"] == "user"]
    if not users or not users[-1]["content"].strip():
        raise RequestError(400, "the last user message is empty; give the problem to reason about", "messages")
    if len(messages) > 1 or tools is not None:
        question = Chat(users[-1]["content"], messages)
    else:
        question = messages[0]["content"]
    tokens = request.max_completion_tokens or body.get("max_tokens")  # (validated; vLLM deprecates reading it)
    return TraceRequest("chat", question=question, max_tokens=tokens, tools=tools, **_common(body, request))


ROLES = ("system", "developer", "user", "assistant", "tool")


def _messages(raw: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as the template reads it: text contents; an assistant's
    ``tool_calls`` with ``arguments`` as objects; each ``tool`` message answering a call
    made before it (by ``tool_call_id``)."""
    out: list[dict[str, Any]] = []
    called: set[str] = set()
    for i, m in enumerate(raw):
        role = m["role"]
        if role not in ROLES:
            raise RequestError(400, f"messages[{i}].role: '{role}' is not a chat role ({', '.join(ROLES)})",
                               "messages")
        message: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                   "content": "" if role == "assistant" and m.get("content") is None
                                   else _text(m.get("content"), i)}
        if role == "assistant" and m.get("tool_calls"):
            message["tool_calls"] = [_history_call(c, i, j) for j, c in enumerate(m["tool_calls"])]
            called |= {c["id"] for c in message["tool_calls"]}
        if role == "tool":
            call_id = m.get("tool_call_id")
            if call_id not in called:
                raise RequestError(400, f"messages[{i}]: a tool message answers tool_call_id {call_id!r}, and no "
                                        "assistant message before it made that call; send the assistant's message "
                                        "with its tool_calls first, and answer each call by its id", "messages")
            message["tool_call_id"] = call_id
        out.append(message)
    return out


def _history_call(call: Mapping[str, Any], i: int, j: int) -> dict[str, Any]:
    """An assistant's earlier call, ``arguments`` parsed (the template reads an object)."""
    where = f"messages[{i}].tool_calls[{j}]"
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError as e:
        raise RequestError(400, f"{where}.function.arguments is not JSON ({e}); send the call's arguments as the "
                                "JSON object the tool got", "messages") from None
    if not isinstance(parsed, dict):
        raise RequestError(400, f"{where}.function.arguments must be a JSON object, got {arguments!r}", "messages")
    return {"id": call.get("id"), "type": "function", "function": {"name": function.get("name"), "arguments": parsed}}


def _tools(body: Mapping[str, Any]) -> ToolRequest | None:
    """The request's tool calling, checked: tools are function schemas with unique names,
    ``tool_choice`` names one of them."""
    if body.get("tools") and not isinstance(body["tools"], list):
        raise RequestError(400, "'tools' must be a list of function schemas", "tools")
    try:
        tools = check_tools(body.get("tools") or [])
    except ToolCallError as e:
        raise RequestError(400, str(e), "tools") from None
    choice = body.get("tool_choice") or "auto"
    if isinstance(choice, Mapping):
        choice = (choice.get("function") or {}).get("name")
    try:
        check_choice(choice, [t["function"]["name"] for t in tools])
    except ToolCallError as e:
        raise RequestError(400, str(e), "tool_choice") from None
    if not tools:
        return None
    parallel = body.get("parallel_tool_calls")
    return ToolRequest(tuple(tools), choice, True if parallel is None else bool(parallel))


def _text(content: Any, index: int) -> str:
    """A message's text: a string, or text parts joined (images and audio: a 400)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(p.get("text", "") for p in content)
    raise RequestError(400, f"messages.{index}.content: stepspec serve reads text only (a string, or parts of "
                            "type 'text')", "messages")


def parse_completion(body: Mapping[str, Any]) -> TraceRequest:
    """A ``/v1/completions`` body: ``prompt`` (one string) is continued as given, as vLLM's
    server does: no chat template wraps it."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise RequestError(400, "'prompt' must be one non-empty string: the question to reason about", "prompt")
    _refuse_unsupported(body, COMPLETION_PARAMETERS, set(CompletionRequest.model_fields))
    try:
        request = CompletionRequest.model_validate({**{k: v for k, v in body.items() if k != EXTENSION},
                                                    "prompt": prompt})
    except ValidationError as e:
        raise _refused(CompletionRequest, e, "the request body") from None
    return TraceRequest("completion", question=RawPrompt(prompt), max_tokens=request.max_tokens,
                        **_common(body, request))
