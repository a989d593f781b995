"""Reading tool calls: the ``hermes_json`` parser (registered in vLLM's tool-parser registry)
on the forms models write, and the checks that make a call invalid. Marked ``vllm``: the
parsers are vLLM's."""

from __future__ import annotations

import json

import pytest

from fake_engine import WordTokenizer
from stepspec.orchestrator.steps import StepRules, TextCalls
from stepspec.workflows.agents.toolcalls import ToolCallError, ToolCalling, call_formats, check_tools

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
    assert required.prefill == "```json\n"
    assert "tool_choice asks for 'multiply'" in named.check(required.parse('{"name": "weather", "arguments": '
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
    from stepspec.workflows.agents.tools import as_tool

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    schema = as_tool(multiply).openai()
    assert check_tools([schema]) == [schema]
    assert schema["function"]["description"] == "Multiply two integers."
    assert json.loads(json.dumps(schema))["function"]["parameters"]["required"] == ["a", "b"]


def _accepts(constraint, text: str) -> bool:
    """Whether the grammar vLLM builds from ``constraint`` (through xgrammar, as its structured
    outputs do) lets a model write ``text``."""
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    if constraint.json is not None:
        grammar = xgr.Grammar.from_json_schema(constraint.json)
    else:
        grammar = xgr.Grammar.from_structural_tag(constraint.structural_tag)
    return _is_grammar_accept_string(grammar, text)


def test_once_a_call_opens_it_names_a_declared_tool_and_its_arguments_follow_the_schema():
    bound = calling().constraint
    for good in ['I multiply.\n\n```json\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n```',
                 '<tool_call>\n{"name": "weather", "arguments": {"city": "Porto"}}\n</tool_call>',
                 'Two calls.\n```json\n{"name": "weather", "arguments": {"city": "Porto"}}\n```\n'
                 '```json\n{"name": "weather", "arguments": {"city": "Lisbon"}}\n```',
                 '{"name": "multiply", "arguments": {"a": 2, "b": 3}}',  # bare, as the pair writes one now and then
                 '{{"name": "multiply", "arguments": {"a": 2, "b": 3}}}',  # with its doubled brace
                 # pretty-printed, as the pair writes a call free: the grammar binds structure, not layout
                 'I multiply.\n```json\n{\n  "name": "multiply",\n  "arguments": {\n    "a": 2,\n'
                 '    "b": 3\n  }\n}\n```',
                 "No call at all: the answer is \\boxed{6}."]:
        assert _accepts(bound, good), good
    for bad in ['```json\n{"name": "divide", "arguments": {"a": 2, "b": 3}}\n```',  # not declared
                '```json\n{"name": "multiply", "arguments": {"a": 2, "b": "three"}}\n```',  # against the schema
                '```json\n{"name": "multiply", "arguments": {"a": 2}}\n```',  # a required argument missing
                '```json\n{"name": "weather", "arguments": {"city": ["Porto", "Lisbon"]}}\n```',  # two folded in one
                '```json\n[{"name": "weather", "arguments": {"city": "Porto"}}]\n```',  # a list of calls
                '{"name": "multiply", "arguments": {"a": 2, "b": "3"}}',  # bare, against the schema
                '```json\n{\n  "name": "multiply",\n  "arguments": {\n    "a": 2\n  }\n}\n```',  # pretty, one missing
                '```json\n{\n  "arguments": {"city": "Porto"},\n  "name": "weather"\n}\n```']:  # name not first
        assert not _accepts(bound, bad), bad
    assert [s.trigger for s in call_formats("hermes_json")] == ["```json", "<tool_call>", '{"name"']


def test_a_guided_turn_of_several_calls_binds_them_compact():
    """Where the guidance asks for a call per item, a call is bound from its compact head (the pair
    writes the next call after a compact one); elsewhere in the layout the model chooses."""
    pretty = '```json\n{\n  "name": "multiply",\n  "arguments": {\n    "a": 2,\n    "b": 3\n  }\n}\n```'
    compact = '```json\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n```'
    guided = calling(guidance=True)
    assert _accepts(guided.constraint, compact + "\n\n" + compact) and not _accepts(guided.constraint, pretty)
    assert [compact[a:b] for a, b in guided.forced_spans(compact)] == ['\n{"name": "', '", "arguments": ']
    for free in (calling(), calling(guidance=True, parallel=False)):
        assert _accepts(free.constraint, pretty) and _accepts(free.constraint, compact)


def test_a_forced_call_is_bound_from_its_first_token():
    named, required = calling(choice="multiply"), calling(choice="required")
    assert _accepts(named.constraint, '{"a": 2, "b": 3}') and not _accepts(named.constraint, '{"a": 2}')
    assert _accepts(required.constraint, '{"name": "weather", "arguments": {"city": "Porto"}}')
    assert not _accepts(required.constraint, '{"name": "divide", "arguments": {"a": 1}}')
    call, = required.parse('{"name": "weather", "arguments": {"city": "Porto"}}').calls
    assert (call.name, call.arguments) == ("weather", {"city": "Porto"})


def test_the_spans_a_bound_call_had_no_choice_in():
    """What the structural tag writes once a call opens: the rest of its beginning, and the name
    where one tool is declared (with two, the name is the model's choice)."""
    text = 'I multiply.\n```json\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n```'
    two = calling().forced_spans(text)
    assert [text[a:b] for a, b in two] == ['\n{"name": "', '", "arguments": ']
    one = ToolCalling([MULTIPLY], tokenizer=WordTokenizer()).forced_spans(text)
    assert [text[a:b] for a, b in one] == ['\n{"name": "multiply", "arguments": ']
    tagged = '<tool_call>\n{"name": "weather", "arguments": {"city": "Porto"}}\n</tool_call>'
    assert [tagged[a:b] for a, b in calling().forced_spans(tagged)] == ['\n{"name": "', '", "arguments": ']
    bare = '{{"name": "weather", "arguments": {"city": "Porto"}}}'
    assert [bare[a:b] for a, b in calling().forced_spans(bare)] == [': "', '", "arguments": ']
    pretty = 'I multiply.\n```json\n{\n  "name": "multiply",\n  "arguments": {\n    "a": 2,\n    "b": 3\n  }\n}\n```'
    assert [pretty[a:b] for a, b in calling().forced_spans(pretty)] == ['\n{\n  "name": "', '",\n  "arguments": ']
    # written free (unbound, a forced reply) or not yet past the name: no span is the grammar's
    assert calling(constrained=False).forced_spans(text) == ()
    assert calling(choice="multiply").forced_spans('{"a": 2, "b": 3}}') == ()
    assert calling().forced_spans('```json\n{\n  "name": "multiply"') == ()
    assert StepRules(calls=calling()).forced_spans(text) == two and StepRules().forced_spans(text) == ()


def test_call_guidance_joins_the_system_message_where_the_model_chooses():
    from stepspec.workflows.agents.toolcalls import GUIDED_SYSTEM, NO_FITTING_CALL, SEVERAL_CALLS

    user = [{"role": "user", "content": "Weather in Porto and Lisbon?"}]
    assert calling().guided(user) == user  # off unless asked
    (system, asked) = calling(guidance=True).guided(user)
    assert system == {"role": "system", "content": f"{GUIDED_SYSTEM} {SEVERAL_CALLS} {NO_FITTING_CALL}"}
    assert asked == user[0]
    (own, _) = calling(guidance=True, parallel=False).guided([{"role": "system", "content": "Be brief."}, *user])
    assert own["content"] == f"Be brief.\n\n{NO_FITTING_CALL}"  # one call a turn: no "one call for each"
    for choice in ("multiply", "required", "none"):  # the model does not choose whether to call
        assert calling(guidance=True, choice=choice).guided(user) == user
    answered = [*user, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "weather", "arguments": {"city": "Porto"}}}]}, {"role": "tool", "tool_call_id": "c1", "content": "sun"}]
    assert calling(guidance=True).guided(answered)[0] == system  # every turn alike: the next prompt continues the last


def test_a_call_written_again_is_a_loop_and_the_calls_end_before_it():
    porto, lisbon = (json.dumps({"name": "weather", "arguments": {"city": c}}) for c in ("Porto", "Lisbon"))
    looping = "\n".join([porto, lisbon, porto, porto, porto])
    assert calling().repeated(looping) and not calling().repeated(f"{porto}\n{lisbon}")
    assert [c.arguments["city"] for c in calling().parse(looping).calls] == ["Porto", "Lisbon"]
    assert StepRules(calls=calling()).calls.repeated(looping)
    assert not TextCalls(start="Action:", stop="Observation:").repeated("Action: a\nAction: a")


def test_binding_is_off_when_asked_and_an_error_where_stepspec_cannot_bind():
    assert calling(constrained=False).constraint is None
    assert calling(choice="none").constraint is None
    auto = calling()
    assert auto.rules(StepRules()).calls is auto and auto.constraint is not None
    assert call_formats("llama3_json") == ()
    with pytest.raises(ToolCallError, match="cannot bind calls to their schemas with parser 'llama3_json'"):
        ToolCalling([MULTIPLY], "llama3_json", tokenizer=WordTokenizer(), constrained=True)


def test_vllms_own_server_takes_hermes_json_through_the_plugin_entry_point():
    """A fresh process that never imports stepspec: vLLM's server command line loads its general
    plug-ins, stepspec's registers hermes_json, and the server's own check of the parser name passes
    (an unknown name fails the same check)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
            "from vllm.entrypoints.launchers.launcher import validate_api_server_args\n"
            "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
            "args = make_arg_parser(FlexibleArgumentParser()).parse_args(\n"
            "    ['--model', 'm', '--enable-auto-tool-choice', '--tool-call-parser', sys.argv[1]])\n"
            "validate_api_server_args(args)\n"
            "print('stepspec' in sys.modules and 'stepspec.orchestrator' in sys.modules)\n")
    ok = subprocess.run([sys.executable, "-c", code, "hermes_json"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.strip().splitlines()[-1] == "False"  # the plug-in registers lazily: no orchestrator loaded
    bad = subprocess.run([sys.executable, "-c", code, "hermes_jsn"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "invalid tool call parser: hermes_jsn" in bad.stderr


def test_the_parser_table_lists_what_stepspec_binds_and_forces():
    from stepspec.workflows.agents.toolcalls import CALL_FORMATS, DEFAULT_TOOL_CALL_PARSER, parser_table

    table = parser_table()
    assert f"| `{DEFAULT_TOOL_CALL_PARSER}` (the default) | stepspec (a vLLM plug-in) |" in table
    assert all(f"| `{name}`" in table for name in CALL_FORMATS)
