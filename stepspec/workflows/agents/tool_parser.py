"""``hermes_json``: vLLM's ``hermes`` tool parser, which also reads calls written as fenced JSON.

Qwen2.5's chat template renders the tools and asks for ``<tool_call>{...}</tool_call>``
tags (what ``hermes`` reads). The bundled Qwen2.5-Coder pair instead answers with a
fenced code block holding the same object::

    ```json
    {"name": "multiply", "arguments": {"a": 1234, "b": 5678}}
    ```

This parser reads the tags first (``hermes`` itself); where there are none, each fenced
block whose JSON is a call, or a list of calls, is one (``"arguments"``, or
``"parameters"`` as some models write it); with no such block, each line that opens a
bare JSON call, read to the call's end (the pair sometimes drops the fence, or writes a
stray fence and text after the call). The text before the first call is the content.
Registered in vLLM's tool-parser registry by a vLLM plug-in (:mod:`stepspec.workflows.agents.parsers`)
under ``hermes_json``, so ``--tool-call-parser hermes_json`` picks it as any vLLM parser.

Worked example: ``"I'll multiply them.\\n\\n```json\\n{\\"name\\": \\"multiply\\", \\"arguments\\":
{\\"a\\": 2, \\"b\\": 3}}\\n```"`` gives one call, ``multiply`` with ``{"a": 2, "b": 3}``, and
the content ``"I'll multiply them."``.

Imports vLLM: loaded only when a request has tools.
"""

from __future__ import annotations

import json
import re

from vllm.entrypoints.generate.base.protocol import ExtractedToolCallInformation, FunctionCall, ToolCall
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

# A fenced code block (```json or bare ```), its body in group 1.
FENCED = re.compile(r"```(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


class HermesJsonToolParser(Hermes2ProToolParser):
    """``hermes``, and fenced JSON blocks where no ``<tool_call>`` tag is written."""

    # Where a call begins in a model's text: a tag, a fence opening a JSON call, or a line
    # opening one bare.
    call_start = r'(?m)<tool_call>|```(?:json|JSON)?\s*[\[{]\s*"name"|^\s*[\[{]\s*\{?\s*"name"\s*:'

    def extract_tool_calls(self, model_output, request) -> ExtractedToolCallInformation:
        tagged = super().extract_tool_calls(model_output, request)
        if tagged.tools_called:
            return tagged
        found = _holding_calls(_fenced(model_output)) or _holding_calls(_bare(model_output))
        if not found:
            return tagged
        first, calls = found[0][0], [call for _, in_value in found for call in in_value]
        content = model_output[:first].strip()
        return ExtractedToolCallInformation(tools_called=True, tool_calls=calls, content=content or None)


# A line opening a bare JSON call (or a list of calls), where _bare starts decoding; the
# pair sometimes doubles the opening brace ("{{"name": ...}}"): the inner object is read.
BARE = re.compile(r'(?m)^[ \t]*([\[{])\s*(\{)?\s*"name"\s*:')


def _holding_calls(values: list[tuple[int, object]]) -> list[tuple[int, list[ToolCall]]]:
    """(where, its calls) of each JSON value that is a call or a list holding calls."""
    out = []
    for start, value in values:
        calls = [call for item in (value if isinstance(value, list) else [value]) if (call := _call(item))]
        if calls:
            out.append((start, calls))
    return out


def _fenced(text: str) -> list[tuple[int, object]]:
    """(where, value) of each fenced block that is JSON."""
    out = []
    for block in FENCED.finditer(text):
        try:
            out.append((block.start(), json.loads(block.group(1))))
        except json.JSONDecodeError:
            continue
    return out


def _bare(text: str) -> list[tuple[int, object]]:
    """(where, value) of each JSON value opening a line, read up to its own end: a call the
    model wrote without a fence, whatever text follows it."""
    out, decoder, end = [], json.JSONDecoder(), 0
    for m in BARE.finditer(text):
        if m.start(1) < end:
            continue
        for start in (m.start(1), m.start(2)) if m.group(2) else (m.start(1),):
            try:
                value, end = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                continue
            out.append((m.start(1), value))
            break
    return out


def _call(item: object) -> ToolCall | None:
    """A call from ``{"name": ..., "arguments": {...}}`` (or ``"parameters"``), else None."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(function=FunctionCall(name=item["name"], arguments=json.dumps(arguments, ensure_ascii=False)))
