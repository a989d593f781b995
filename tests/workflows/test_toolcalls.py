"""Reading tool calls: the ``hermes_json`` parser (registered in vLLM's tool-parser registry)
on the forms models write, and the checks that make a call invalid. Marked ``vllm``: the
parsers are vLLM's."""

from __future__ import annotations

import json

import pytest

from fake_engine import WordTokenizer
from workflows.agents.toolcalls import ToolCallError, ToolCalling, check_tools

pytestmark = pytest.mark.vllm

MULTIPLY = {"type": "function", "function": {"name": "multiply", "description": "Multiply.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
CITY = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def calling(**kwargs) -> ToolCalling:
    return ToolCalling([MULTIPLY, CITY], tokenizer=WordTokenizer(), **kwargs)


@pytest.mark.parametrize("text, content", [
    ('I multiply.\n\n```json\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n```', "I multiply."),
    ('<tool_call>\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n</tool_call>', None),  # hermes itself
    ('{"name": "multiply", "arguments": {"a": 2, "b": 3}}', None),  # bare, as the 0.5B sometimes writes
    ('```\n{"name": "multiply", "parameters": {"a": 2, "b": 3}}\n```', None),  # "parameters", a bare fence
    # bare, then a stray fence and a made-up result; and a doubled opening brace (both the pair's)
    ('I look it up.\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n```\nIt is 6.\n```', "I look it up."),
    ('{{"name": "multiply", "arguments": {"a": 2, "b": 3}}', None),
])
def test_hermes_json_reads_a_call_in_every_form_the_pair_writes(text, content):
    parsed = calling().parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("multiply", {"a": 2, "b": 3})]
    assert parsed.content == content and parsed.problems == ()


def test_several_calls_in_one_step_and_parallel_tool_calls_false_keeps_the_first():
    text = '```json\n[{"name": "weather", "arguments": {"city": "Lisbon"}}, ' \
           '{"name": "weather", "arguments": {"city": "Porto"}}]\n```'
    assert [c.arguments["city"] for c in calling().parse(text).calls] == ["Lisbon", "Porto"]
    assert [c.arguments["city"] for c in calling(parallel=False).parse(text).calls] == ["Lisbon"]
    assert calling().parse("No call here, just \\boxed{6}.").calls == ()


@pytest.mark.parametrize("text, says", [
    ('```json\n{"name": "divide", "arguments": {"a": 1}}\n```', "'divide' is not a declared tool"),
    ('```json\n{"name": "multiply", "arguments": {"a": 1}}\n```', "multiply: 'b' is a required property"),
    ('```json\n{"name": "multiply", "arguments": {"a": 1, "b": "two"}}\n```', "multiply: b: 'two' is not of type"),
    ('```json\n{"name": "multiply", "arguments": {"a": 1, ', "a call begins but none can be read"),
])
def test_an_invalid_call_says_why(text, says):
    assert says in calling().problem(text)


def test_a_named_tool_choice_prefills_the_call_and_rejects_another_function():
    named = calling(choice="multiply")
    assert named.prefill == '```json\n{"name": "multiply", "arguments": '
    assert [t["function"]["name"] for t in named.rendered_tools] == ["multiply"]
    assert named.parse('{"a": 2, "b": 3}}\n```').calls[0].arguments == {"a": 2, "b": 3}
    required = calling(choice="required")
    assert "tool_choice asks for 'multiply'" in named.check(required.parse('weather", "arguments": '
                                                                             '{"city": "x"}}\n```').calls[0])
    assert calling(choice="none").rendered_tools == []
    with pytest.raises(ToolCallError,
                       match="tool_choice names function 'multiplyy', which is not among the tools"
                             ".*Did you mean 'multiply'"):
        calling(choice="multiplyy")


@pytest.mark.parametrize("tools, says", [
    ([MULTIPLY, MULTIPLY], "two tools are named 'multiply'"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}], "not a JSON schema"),
    ([{"type": "retrieval"}], "a tool is {'type': 'function'"),
    ([{"type": "function", "function": {"name": "has space"}}], "is not a function name"),
])
def test_tool_declarations_are_checked(tools, says):
    with pytest.raises(ToolCallError, match="tools\\["):
        check_tools(tools)
    with pytest.raises(ToolCallError) as e:
        check_tools(tools)
    assert says in str(e.value)


def test_a_typed_function_is_declared_as_its_openai_schema():
    from workflows.agents.tools import as_tool

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    schema = as_tool(multiply).openai()
    assert check_tools([schema]) == [schema]
    assert schema["function"]["description"] == "Multiply two integers."
    assert json.loads(json.dumps(schema))["function"]["parameters"]["required"] == ["a", "b"]
