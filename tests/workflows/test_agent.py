"""The agent: tool-call parsing, the reason-act loop, speculative tool calls, timeouts."""

import asyncio
import time

import pytest

from fake_engine import ScriptedEngine
from stepspec.judges.base import Verdict
from stepspec.orchestrator.reasoner import Reasoner
from stepspec.orchestrator.trace import Trace
from stepspec.workflows.agents.agent import Agent, AgentError, parse_action
from stepspec.workflows.agents.toolcalls import Call
from stepspec.workflows.examples.tools import calculator
from stepspec.workflows.agents.tools import ToolError, as_tool, make_tool, tool

TOOLS = {"calculator": as_tool(calculator)}


@tool
def lookup(city: str, year: int = 2024) -> str:
    """Population of a city."""
    return f"{city} {year}"


def _read(text, tools):
    """The (tool, arguments) a step's action names, or the observation saying what is wrong."""
    call = parse_action(text, tools)
    if isinstance(call, Call):
        assert call.id.startswith("call_")
        return call.name, call.arguments
    return call


@pytest.mark.parametrize("text, expected", [
    ('Action: calculator({"expression": "48 / 2"})', ("calculator", {"expression": "48 / 2"})),
    ("Action: calculator(expression='3 * 4')", ("calculator", {"expression": "3 * 4"})),
    ('Action: calculator("3 * 4")', ("calculator", {"expression": "3 * 4"})),
    ("Action: calculator(16 - 3 - 4)", ("calculator", {"expression": "16 - 3 - 4"})),
    ('**Action:** Calculator({"expression": "2+2"})', ("calculator", {"expression": "2+2"})),
    ('First I add.\n2. Action: `calculator({"expression": "(1+2)*3"})`',
     ("calculator", {"expression": "(1+2)*3"})),
])
def test_tool_calls_are_read_in_the_forms_small_models_write(text, expected):
    assert _read(text, TOOLS) == expected


def test_several_arguments_and_mistakes_give_observations_not_crashes():
    tools = {"lookup": as_tool(lookup), **TOOLS}
    assert _read("Action: lookup('Paris', 1990)", tools) == ("lookup", {"city": "Paris", "year": 1990})
    assert _read('Action: lookup({"city": "Rome"})', tools) == ("lookup", {"city": "Rome"})
    assert "no tool 'weather'" in parse_action("Action: weather(city='x')", tools)
    assert "cannot read the arguments of lookup" in parse_action("Action: lookup(Paris, 1990)", tools)
    assert "not written as Action" in parse_action("Action: lookup('Paris', 1990", tools)


def test_tool_schema_from_type_hints_and_its_errors():
    t = as_tool(lookup)
    assert t.parameters["required"] == ["city"] and t.parameters["properties"]["year"]["type"] == "integer"
    assert t.signature() == "lookup(city: str, year: int): Population of a city."
    r = asyncio.run(t.call({"city": "Oslo", "year": "nineteen"}))
    assert not r.ok and "year" in r.observation and "lookup(city: str, year: int)" in r.observation

    def untyped(x):
        return x

    with pytest.raises(ToolError, match="parameter 'x' has no type hint"):
        make_tool(untyped)


def test_a_hanging_tool_is_cut_off_by_its_timeout():
    @tool(timeout=0.2)
    async def hangs(x: int) -> int:
        await asyncio.sleep(30)
        return x

    @tool(timeout=0.2)
    def blocks(x: int) -> int:
        time.sleep(3)
        return x

    for t in (hangs, blocks):
        t0 = time.perf_counter()
        r = asyncio.run(as_tool(t).call({"x": 1}))
        assert r.timed_out and not r.ok and "timed out after 0.2 s" in r.observation
        assert time.perf_counter() - t0 < 1.5


# -- the loop, on scripted engines ---------------------------------------------------------


def agent_engine(calls, answer="So the answer is \\boxed{33}."):
    """Writes one step per turn: the n-th tool call while observations are fewer than
    the calls, then the answer."""

    def continuation(prompt):
        n = prompt.count("Observation:") - prompt.count('"Observation: ...')  # the system prompt names it once
        return calls[n] + "\n\n" if n < len(calls) else answer

    return ScriptedEngine(continuation=continuation)


class FixedJudge:
    needs_target_step = needs_draft_tokens = False
    draft_top_k = 0

    def __init__(self, accept):
        self.accept, self.name = accept, "fixed"

    async def judge(self, candidates):
        return [Verdict(self.name, self.accept, score=9.0 if self.accept else 0.0) for _ in candidates]


def test_agent_reasons_calls_the_tool_and_answers():
    engine = agent_engine(['Action: calculator({"expression": "48 / 2"})', "Action: calculator(24 + 9)"])
    agent = Agent(Reasoner(engine, strategy="target-only"), tools=[calculator])
    result = agent.run("Natalia sold 48 clips in April and half as many in May. How many more than 9?")
    assert result.answer == "33" and result.stop_reason == "answer" and result.num_iterations == 3
    assert [(c.tool, c.args, c.observation, c.used) for c in result.tool_calls] == [
        ("calculator", {"expression": "48 / 2"}, "24", True), ("calculator", {"expression": "24 + 9"}, "33", True)]
    assert [m for m in result.messages if m[0] == "user"][1:] == [("user", "Observation: 24"), ("user", "Observation: 33")]
    assert "calculator(expression: str)" in result.messages[0][1]
    assert all(t.stop_reason == "action" for t in result.traces[:2])
    saved = Trace.from_json(result.traces[1].to_json())  # a trace of a chat is saved like any other
    assert saved.question == result.task and saved.stop_reason == "action"


def test_malformed_call_gets_an_observation_and_the_agent_goes_on():
    engine = agent_engine(["Action: calculator(2 +)"], answer="\\boxed{4}")
    result = Agent(Reasoner(engine, strategy="target-only"), tools=[calculator]).run("2 + 2?")
    assert result.answer == "4" and result.tool_calls[0].ok is False
    assert "error: calculator raised" in result.messages[3][1]


def test_iteration_limit_stops_the_loop():
    engine = agent_engine([f"Action: calculator(1 + {n})" for n in range(10)])  # a new call each turn
    result = Agent(Reasoner(engine, strategy="target-only"), tools=[calculator], max_iterations=3).run("loop")
    assert result.stop_reason == "max_iterations" and result.num_iterations == 3 and result.answer is None
    assert result.output is None  # no final reply: the stop reason says why
    with pytest.raises(AgentError, match="two tools"):
        Agent(Reasoner(engine, strategy="target-only"), tools=[calculator, calculator])


def run_specreason(draft_call, target_call, accept, tools):
    draft = agent_engine([draft_call])
    target = agent_engine([target_call])
    reasoner = Reasoner(target, draft, strategy="specreason", judge=FixedJudge(accept), first_target_steps=0)
    return Agent(reasoner, tools=tools).run("What is 2 + 3?")


def test_side_effect_free_call_runs_while_the_step_is_judged_and_is_used_when_accepted():
    result = run_specreason('Action: calculator("2 + 3")', 'Action: calculator("2 * 3")', True, [calculator])
    (call,) = result.tool_calls
    assert call.args == {"expression": "2 + 3"} and call.speculative and call.used and call.observation == "5"


def test_speculative_result_is_discarded_when_the_draft_step_is_rejected():
    result = run_specreason('Action: calculator("2 + 3")', 'Action: calculator("2 * 3")', False, [calculator])
    used = [c for c in result.tool_calls if c.used]
    discarded = [c for c in result.tool_calls if not c.used]
    assert [(c.args["expression"], c.speculative, c.observation) for c in used] == [("2 * 3", False, "6")]
    assert [(c.args["expression"], c.speculative) for c in discarded] == [("2 + 3", True)]
    assert "Observation: 6" in [m[1] for m in result.messages]
    assert "Observation: 5" not in [m[1] for m in result.messages]


def test_tools_with_side_effects_never_run_speculatively():
    sent = []

    @tool(side_effect_free=False)
    def send(message: str) -> str:
        """Send a message."""
        sent.append(message)
        return "sent"

    result = run_specreason('Action: send("draft")', 'Action: send("target")', False, [send])
    assert sent == ["target"]  # the rejected draft's call never ran
    assert [(c.args, c.speculative, c.used) for c in result.tool_calls] == [({"message": "target"}, False, True)]
    accepted = run_specreason('Action: send("draft")', 'Action: send("target")', True, [send])
    assert sent == ["target", "draft"] and accepted.tool_calls[0].speculative is False  # ran after acceptance


# -- the model's own tool format (its template renders the tools) ------------------------------


def template_engine(calls, answer="So the answer is \\boxed{5}."):
    """Writes the n-th call (fenced JSON, as the bundled pair does) after n tool results, then the answer."""

    def continuation(prompt):
        n = prompt.count("<|tool|>") + prompt.count("That tool call is invalid")
        return calls[n] if n < len(calls) else answer

    return ScriptedEngine(continuation=continuation, renders_tools=True)


def fenced(expression):
    return '```json\n{"name": "calculator", "arguments": {"expression": "%s"}}\n```' % expression


@pytest.mark.vllm  # calls are read by vLLM's tool parsers
def test_in_the_template_format_a_drafted_call_runs_speculatively_and_its_result_is_a_tool_message():
    draft, target = template_engine([fenced("2 + 3")]), template_engine([fenced("2 * 3")])
    reasoner = Reasoner(target, draft, strategy="specreason", judge=FixedJudge(True), first_target_steps=0)
    agent = Agent(reasoner, tools=[calculator])
    result = agent.run("What is 2 + 3?")
    (call,) = result.tool_calls
    assert call.args == {"expression": "2 + 3"} and call.speculative and call.used and call.observation == "5"
    assert ("tool", "5") in result.messages and result.answer == "5"
    assert '<|tools|>["calculator"]' in draft.prompts[0]  # the template rendered the tool
    assert "Action:" not in draft.prompts[0]  # and the text format's prompt is not used


@pytest.mark.vllm  # calls are read by vLLM's tool parsers
def test_in_the_template_format_a_turns_two_calls_both_run_and_come_back_as_two_tool_messages():
    first, second = fenced("2 + 3"), fenced("2 * 3")

    def continuation(prompt):
        if prompt.count("<|tool|>") >= 2:
            return "So the answer is \\boxed{11}."
        return second if prompt.endswith(first + "\n\n") else first + "\n\n" + second

    engine = ScriptedEngine(continuation=continuation, renders_tools=True)
    result = Agent(Reasoner(engine, strategy="target-only"), tools=[calculator]).run("What is 2 + 3, and 2 * 3?")
    assert [c.args["expression"] for c in result.tool_calls] == ["2 + 3", "2 * 3"]
    assert [text for role, text in result.messages if role == "tool"] == ["5", "6"] and result.answer == "11"


@pytest.mark.vllm  # calls are read by vLLM's tool parsers
def test_an_agents_output_is_its_final_reply_never_its_calls_or_their_results():
    engine = template_engine([fenced("2 + 3")], answer="The sum is five.")
    result = Agent(Reasoner(engine, strategy="target-only"), tools=[calculator]).run("What is 2 + 3?")
    assert result.output == "The sum is five." and result.answer is None and result.stop_reason == "eos"
    assert [(c.tool, c.observation) for c in result.tool_calls] == [("calculator", "5")]
    assert any(role == "tool" for role, _ in result.messages)  # the call and its result stay in the chat


@pytest.mark.vllm  # calls are read by vLLM's tool parsers
def test_a_repeated_call_is_answered_with_its_earlier_result_and_a_third_ends_the_loop():
    runs = []

    def lookup(key: str) -> str:
        """Look a key up."""
        runs.append(key)
        return "42"

    call = '```json\n{"name": "lookup", "arguments": {"key": "x"}}\n```'
    engine = template_engine([call] * 5)
    result = Agent(Reasoner(engine, strategy="target-only"), tools=[lookup]).run("What is x?")
    assert runs == ["x"] and result.stop_reason == "repeated_call" and result.output is None
    observations = [text for role, text in result.messages if role == "tool"]
    assert observations[0] == "42" and len(observations) == 3
    assert "called with these arguments before and returned: 42" in observations[1]


@pytest.mark.vllm  # calls are read by vLLM's tool parsers
def test_in_the_template_format_an_invalid_call_of_the_target_gets_a_message_and_the_agent_goes_on():
    engine = template_engine(['```json\n{"name": "calculator", "arguments": {"expr": "1"}}\n```'])
    result = Agent(Reasoner(engine, strategy="target-only"), tools=[calculator]).run("What is 2 + 3?")
    assert result.tool_calls == () and result.answer == "5"
    said = [text for role, text in result.messages if role == "user"]
    assert any("That tool call is invalid" in text and "'expr' was unexpected" in text for text in said)


def test_text_format_where_the_template_renders_no_tools_and_by_choice():
    engine = agent_engine(['Action: calculator("2 + 3")'])  # a template without tools: auto is text
    assert asyncio.run(Agent(Reasoner(engine, strategy="target-only"), tools=[calculator]).format()) == "text"
    chosen = Agent(Reasoner(template_engine([]), strategy="target-only"), tools=[calculator], tool_format="text")
    assert asyncio.run(chosen.format()) == "text"
    with pytest.raises(AgentError, match="tool_format must be one of"):
        Agent(Reasoner(engine, strategy="target-only"), tools=[calculator], tool_format="json")
