"""Tool calling through `stepspec serve`: the openai SDK and the OpenAI Agents SDK with tools,
over real HTTP, on scripted engines whose template renders tools. Calls are read by vLLM's
tool-parser registry (``hermes_json``, registered by stepspec); marked ``vllm`` for that."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from stepspec.workflows.agents.toolcalls import ToolCallError

from fake_engine import ScriptedEngine
from openai_server import sdk_client, serving
from scripted import FixedJudge

pytestmark = pytest.mark.vllm


def function(name: str, description: str, **properties: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in properties.items()},
                       "required": list(properties)}}}


MULTIPLY = function("multiply", "Multiply two integers.", a="integer", b="integer")
ADD = function("add", "Add two integers.", a="integer", b="integer")
TOOLS = [MULTIPLY, ADD]
Q = "A shop has 12 boxes of 13 apples. How many apples?"


def fenced(name: str, **arguments) -> str:
    """A call as the bundled pair writes it: a fenced JSON block."""
    return f'```json\n{json.dumps({"name": name, "arguments": arguments})}\n```'


def agent_script(*turns: tuple[str, ...], **kwargs) -> ScriptedEngine:
    """An engine whose template renders tools, writing ``turns[k]``'s steps after k tool results."""

    def continuation(prompt: str) -> str:
        steps = turns[min(prompt.count("<|tool|>"), len(turns) - 1)]
        n = prompt.split("<|assistant|>")[-1].count("\n\n")
        return steps[min(n, len(steps) - 1)]

    return ScriptedEngine(continuation=continuation, renders_tools=True, **kwargs)


CALLING = ("I multiply the boxes by the apples in each.\n\n", fenced("multiply", a=12, b=13))
ANSWERING = ("So the shop has \\boxed{156} apples.",)


def reasoner(draft_turns=(CALLING, ANSWERING), target_turns=(CALLING, ANSWERING), strategy="specreason", **kwargs):
    from stepspec.orchestrator.reasoner import Reasoner

    target = agent_script(*target_turns, **kwargs)
    if strategy == "target-only":
        return Reasoner(target, strategy="target-only")
    return Reasoner(target, agent_script(*draft_turns), strategy=strategy, judge=FixedJudge(True),
                    first_target_steps=0)


def ask(url: str, **body):
    return httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": "stepspec", "messages": [{"role": "user", "content": Q}], "tools": TOOLS, **body})


def test_the_openai_sdk_gets_a_drafted_call_as_tool_calls_streamed_or_not():
    served = reasoner()
    with serving({"stepspec": served}) as url:
        sdk = sdk_client(url)
        reply = sdk.chat.completions.create(model="stepspec", messages=[{"role": "user", "content": Q}], tools=TOOLS)
        choice = reply.choices[0]
        (call,) = choice.message.tool_calls
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert call.function.name == "multiply" and json.loads(call.function.arguments) == {"a": 12, "b": 13}
        assert call.id.startswith("call_") and call.type == "function"
        assert choice.message.model_extra["reasoning_content"] == CALLING[0]
        stats = reply.model_extra["stepspec"]
        assert stats["stop_reason"] == "action"
        calls = stats["tool_call_steps"]
        assert calls == {"steps": 1, "drafted": 1, "kept": 1, "cut": 0, "draft_tokens": calls["kept_tokens"],
                         "kept_tokens": calls["draft_tokens"]} and calls["draft_tokens"] > 0
        # the template rendered the tools, and the trace continued it
        assert '<|tools|>["multiply", "add"]' in served.draft.prompts[0]

        chunks = list(sdk.chat.completions.create(model="stepspec", messages=[{"role": "user", "content": Q}],
                                                  tools=TOOLS, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == CALLING[0]
        pieces = [t for d in deltas for t in d.tool_calls or ()]
        assert pieces[0].index == 0 and pieces[0].id.startswith("call_") and pieces[0].function.name == "multiply"
        assert len(pieces) > 2 and all(p.index == 0 and p.id is None for p in pieces[1:])  # arguments in pieces
        assert json.loads("".join(p.function.arguments for p in pieces)) == {"a": 12, "b": 13}
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


TWO_CALLS = ("I multiply the boxes, then add the spare apples.\n\n", fenced("multiply", a=12, b=13) + "\n\n",
             fenced("add", a=156, b=4) + "\n\n", "Both calls are made.")


def test_two_calls_a_blank_line_apart_are_two_tool_calls_streamed_or_not_and_one_without_parallel_calls():
    served = reasoner(draft_turns=(TWO_CALLS, ANSWERING), target_turns=(TWO_CALLS, ANSWERING))
    with serving({"stepspec": served}) as url:
        sdk = sdk_client(url)
        reply = sdk.chat.completions.create(model="stepspec", messages=[{"role": "user", "content": Q}], tools=TOOLS)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
            ("multiply", {"a": 12, "b": 13}), ("add", {"a": 156, "b": 4})]
        assert choice.message.model_extra["reasoning_content"] == TWO_CALLS[0]
        # the turn ended at the first step after the calls that holds none (kept, not a call)
        assert reply.model_extra["stepspec"]["stop_reason"] == "action"
        chunks = list(sdk.chat.completions.create(model="stepspec", messages=[{"role": "user", "content": Q}],
                                                  tools=TOOLS, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == TWO_CALLS[0]
        pieces = [t for d in deltas for t in d.tool_calls or ()]
        named = [(p.index, p.function.name) for p in pieces if p.id is not None]
        assert named == [(0, "multiply"), (1, "add")]
        assert json.loads("".join(p.function.arguments for p in pieces if p.index == 1)) == {"a": 156, "b": 4}
        one = ask(url, parallel_tool_calls=False).json()["choices"][0]
        assert [c["function"]["name"] for c in one["message"]["tool_calls"]] == ["multiply"]


def test_a_conversation_ending_with_the_tools_result_is_answered_and_the_call_is_rendered():
    served = reasoner()
    history = [{"role": "user", "content": Q},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "multiply", "arguments": '{"a": 12, "b": 13}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "156"}]
    with serving({"stepspec": served}) as url:
        reply = sdk_client(url).chat.completions.create(model="stepspec", messages=history, tools=TOOLS)
    assert reply.choices[0].message.content == ANSWERING[0] and reply.choices[0].finish_reason == "stop"
    assert not reply.choices[0].message.tool_calls
    prompt = served.draft.prompts[0]
    assert '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 13}}</tool_call>' in prompt
    assert prompt.endswith("<|tool|>156\n<|assistant|>")


def test_a_drafted_call_that_breaks_its_schema_is_rejected_and_the_target_writes_the_step():
    bad = ("I multiply.\n\n", fenced("multiply", a=12))  # b is missing
    served = reasoner(draft_turns=(bad, ANSWERING))
    with serving({"stepspec": served}) as url:
        reply = ask(url).json()
    (call,) = reply["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"a": 12, "b": 13}  # the target's call
    calls = reply["stepspec"]["tool_call_steps"]
    assert calls == {"steps": 1, "drafted": 1, "kept": 0, "cut": 1, "draft_tokens": calls["draft_tokens"],
                     "kept_tokens": 0} and calls["draft_tokens"] > 0  # rejected whole: no drafted token kept


def test_an_invalid_call_the_target_writes_is_returned_as_text_with_its_problem():
    wrong = (fenced("divide", a=12, b=13),)
    with serving({"stepspec": reasoner(target_turns=(wrong,), strategy="target-only")}) as url:
        reply = ask(url).json()
    choice = reply["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == wrong[0]
    assert "'divide' is not a declared tool" in reply["stepspec"]["tool_call_problems"][0]


def test_a_named_tool_choice_forces_the_call_its_opening_prefilled():
    rest = ('{"a": 12, "b": 13}}\n```',)
    served = reasoner(target_turns=(rest,), strategy="target-only")
    with serving({"stepspec": served}) as url:
        reply = ask(url, tool_choice={"type": "function", "function": {"name": "multiply"}}).json()
        none = ask(url, tool_choice="none").json()
    (call,) = reply["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "multiply" and reply["choices"][0]["finish_reason"] == "tool_calls"
    assert served.target.prompts[0].endswith('<|assistant|>```json\n{"name": "multiply", "arguments": ')
    assert '["multiply"]' in served.target.prompts[0]  # only the named tool is rendered
    # tool_choice none: no tools rendered, no call read
    assert none["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in none["choices"][0]["message"]
    assert "<|tools|>" not in served.target.prompts[-1]


def test_a_forced_call_is_read_from_its_prefilled_opening_even_a_brace_short():
    """The model continues the prefilled opening; the arguments are its first JSON value (as vLLM
    reads a forced call), so a call whose outer brace the model never closes is still the call."""
    named = reasoner(target_turns=(('{"a": 12, "b": 13}\n```',),), strategy="target-only")
    required = reasoner(target_turns=(('{"name": "add", "arguments": {"a": 1, "b": 2}}\n```\n',),), strategy="target-only")
    with serving({"named": named, "required": required}) as url:
        one = ask(url, model="named", tool_choice={"type": "function", "function": {"name": "multiply"}}).json()
        two = ask(url, model="required", tool_choice="required").json()
    for reply, name, arguments in ((one, "multiply", {"a": 12, "b": 13}), (two, "add", {"a": 1, "b": 2})):
        choice = reply["choices"][0]
        (call,) = choice["message"]["tool_calls"]
        assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (name, arguments)
        assert choice["finish_reason"] == "tool_calls" and not choice["message"].get("content")
    assert required.target.prompts[0].endswith('<|assistant|>```json\n')
    # both generated bound: the named function's arguments, any declared call's object
    (named_sampling,), (required_sampling,) = named.target.samplings, required.target.samplings
    assert json.loads(named_sampling.structured.json)["required"] == ["a", "b"]
    assert {s["properties"]["name"]["const"] for s in json.loads(required_sampling.structured.json)["anyOf"]} \
        == {"add", "multiply"}


def test_calls_are_generated_bound_to_the_schemas_unless_the_server_turns_it_off():
    bound, free = reasoner(strategy="target-only"), reasoner(strategy="target-only")
    with serving({"stepspec": bound}) as url:
        ask(url)
    with serving({"stepspec": free}, constrained_calls=False) as url:
        ask(url)
    tag = json.loads(bound.target.samplings[0].structured.structural_tag)["format"]
    assert {t["begin"] for t in tag["tags"]} >= {'```json\n', '<tool_call>\n', '{"name": "multiply", "arguments": '}
    assert [s.structured for s in free.target.samplings] == [None] * len(free.target.samplings)
    with pytest.raises(ToolCallError, match="cannot bind calls to their schemas with parser 'llama3_json'"):
        with serving({"stepspec": reasoner(strategy="target-only")}, constrained_calls=True,
                     tool_call_parser="llama3_json"):
            pass


def test_the_server_guides_the_model_to_a_call_per_item_when_asked():
    from stepspec.workflows.agents.toolcalls import NO_FITTING_CALL, SEVERAL_CALLS

    guided, plain = reasoner(strategy="target-only"), reasoner(strategy="target-only")
    with serving({"stepspec": guided}, call_guidance=True) as url:
        ask(url)
        ask(url, tool_choice={"type": "function", "function": {"name": "multiply"}})
    with serving({"stepspec": plain}) as url:  # the default: the messages as sent
        ask(url)
    auto, named = guided.target.prompts[0], guided.target.prompts[-1]
    assert auto.startswith("<|tools|>") and f"<|system|>You are a helpful assistant. {SEVERAL_CALLS} " \
        f"{NO_FITTING_CALL}\n<|user|>{Q}" in auto
    assert SEVERAL_CALLS not in named and "<|system|>" not in named  # a forced call: the messages as sent
    assert "<|system|>" not in plain.target.prompts[0]


@pytest.mark.parametrize("change, says", [
    ({"tools": [function("multiply", "x", a="integer"), function("multiply", "y", b="integer")]},
     "two tools are named 'multiply'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}]},
     "tools[0].function.parameters: not a JSON schema"),
    ({"tool_choice": {"type": "function", "function": {"name": "multiplyy"}}},
     "tool_choice names function 'multiplyy', which is not among the tools (declared: multiply, add). Did you mean "
     "'multiply'?"),
    ({"messages": [{"role": "user", "content": Q}, {"role": "tool", "tool_call_id": "call_9", "content": "1"}]},
     "answers tool_call_id 'call_9', and no assistant message before it made that call"),
    ({"max_tokens": 1_000_000_000}, "max_tokens=1000000000 does not fit: this model's context is 4096 tokens"),
    ({"tools": {"multiply": MULTIPLY}}, "'tools' must be a list of function schemas"),
    ({"messages": [{"role": "user", "content": "many words " * 3000}]},
     "and this model's context is 4096; send a shorter conversation"),
])
def test_bad_tool_requests_are_400s_naming_the_problem_and_the_server_goes_on(change, says):
    with serving({"stepspec": reasoner(max_model_len=4096)}) as url:
        refused = ask(url, **change)
        assert refused.status_code == 400, refused.text
        assert says in refused.json()["error"]["message"]
        assert ask(url).json()["choices"][0]["finish_reason"] == "tool_calls"


def test_an_unknown_tool_call_parser_fails_when_the_server_is_built():
    from stepspec.workflows.agents.toolcalls import ToolCallError
    from stepspec.workflows.serve.app import build_app
    from stepspec.workflows.serve.settings import ServeSettings

    with pytest.raises(ToolCallError, match="unknown tool-call parser 'hermez'. Did you mean 'hermes'"):
        build_app({"stepspec": reasoner()}, ServeSettings(tool_call_parser="hermez"))


def test_completions_continue_the_prompt_as_given_without_a_chat_template():
    served = reasoner(target_turns=((" 4",),), strategy="target-only")
    with serving({"stepspec": served}) as url:
        reply = httpx.post(f"{url}/v1/completions", timeout=60,
                           json={"model": "stepspec", "prompt": "Question: 2 + 2\nAnswer:"})
    assert served.target.prompts[0] == "Question: 2 + 2\nAnswer:"
    assert reply.json()["choices"][0]["text"] == " 4"


def test_an_openai_agents_sdk_agent_completes_a_two_tool_task_against_stepspec_serve():
    """The OpenAI Agents SDK's own loop: it sends the tools, runs each call the model makes
    and sends the result back, until the model answers."""
    agents = pytest.importorskip("agents")
    turns = (CALLING, ("Now I add the 7 apples of the last delivery.\n\n", fenced("add", a=156, b=7)),
             ("The shop has \\boxed{163} apples.",))
    called = []

    @agents.function_tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        called.append(("multiply", a, b))
        return a * b

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        called.append(("add", a, b))
        return a + b

    async def run(url: str):
        from openai import AsyncOpenAI

        agents.set_tracing_disabled(True)
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        agent = agents.Agent(name="shop", instructions="Use the tools for every calculation.", tools=[multiply, add],
                             model=agents.OpenAIChatCompletionsModel(model="stepspec", openai_client=client))
        return await agents.Runner.run(agent, Q + " Then 7 more arrive.", max_turns=6)

    with serving({"stepspec": reasoner(draft_turns=turns, target_turns=turns)}) as url:
        result = asyncio.run(run(url))
    assert called == [("multiply", 12, 13), ("add", 156, 7)]
    assert "\\boxed{163}" in result.final_output


class NeverStarted(ScriptedEngine):
    """A target that a strategy never starts (draft-only): any use of it is an error, as for vLLM's."""

    async def acount_tokens(self, text):
        raise AssertionError("the target is not started")

    async def aapply_chat_template(self, *args, **kwargs):
        raise AssertionError("the target is not started")


def test_draft_only_answers_with_tools_from_the_draft_alone():
    from stepspec.orchestrator.reasoner import Reasoner

    served = Reasoner(NeverStarted(renders_tools=True), agent_script(CALLING, ANSWERING, max_model_len=4096),
                      strategy="draft-only")
    with serving({"stepspec": served}) as url:
        reply = ask(url, max_tokens=100).json()
        assert ask(url, max_tokens=5000).status_code == 400  # the draft's context is the measure
    assert reply["choices"][0]["finish_reason"] == "tool_calls" and not served.target.prompts


def test_a_token_level_verifier_is_asked_to_hold_the_call_step_to_the_targets_own_tokens():
    served = reasoner()
    with serving({"stepspec": served}) as url:
        assert ask(url).json()["choices"][0]["finish_reason"] == "tool_calls"
    assert [(c.draft_step, c.exact) for c in served.judge.seen] == [(CALLING[0].strip(), False), (CALLING[1], True)]


def test_an_agent_workload_runs_in_stepspec_bench_through_the_serve_app(tmp_path):
    """``agent-shop`` task 0 (3 glue sticks at $28, 6 rulers at $24, 4 staplers at $17) by the
    OpenAI Agents SDK's loop, per arm, one at a time and in a wave: turns, tool calls,
    prefix-cache counts and the tool-call steps are saved with each sample, and the report
    has their table."""
    pytest.importorskip("agents")
    from stepspec.workflows.eval.bench import BenchSettings
    from stepspec.workflows.eval.bench_run import run_bench
    from stepspec.workflows.eval.rundir import read_samples
    from stepspec.workflows.serve.agent_workload import solve_agent_task

    turns = (("I look up the glue sticks first.\n\n", fenced("get_price", item="glue stick")),
             (fenced("get_price", item="rulers"),), (fenced("get_price", item="stapler"),),
             ("3 glue sticks cost 84 dollars and 6 rulers 144.\n\n", "4 staplers cost 4 * 17 = 68 dollars.\n\n",
              "In total he pays \\boxed{296} dollars."))
    target = agent_script(*turns)
    spec = BenchSettings(dataset="agent-shop", limit=1, strategies=("target-only", "specreason"),
                     modes=("throughput", "latency"),
                     strategy_options={"specreason": {"judge": "score", "first_target_steps": 0}})
    results = asyncio.run(run_bench(spec, tmp_path / "run", engines=(target, agent_script(*turns)),
                                    agent_solver=solve_agent_task))
    assert results.status == "complete"
    for name in ("target-only", "target-only_throughput", "specreason", "specreason_throughput"):
        (sample,) = read_samples(tmp_path / "run" / f"samples_agent-shop_{name}.jsonl")
        assert sample.correct["exact"] and sample.answer == "296", sample.response
        assert [t.tool_calls for t in sample.agent.turns] == [["get_price"]] * 3 + [[]]
        assert [t.finish_reason for t in sample.agent.turns] == ["tool_calls"] * 3 + ["stop"]
        prompts = [t.prompt_tokens for t in sample.agent.turns]
        assert prompts == sorted(prompts) and prompts[0] > 0  # the conversation grows turn by turn
        roles = {"target", "draft"} if name.startswith("specreason") else {"target"}
        assert set(sample.agent.prompt_tokens) == roles  # each engine's prompt and cached tokens over the task
        assert sample.stats.model_extra["tool_call_steps"]["steps"] == 3
        assert sample.stats.model_extra["tool_call_steps"]["drafted"] == (3 if name.startswith("specreason") else 0)
        assert sample.stats.num_steps == 7  # the four turns' steps, chained
    assert all(f"One {item} costs ${price}." in target.prompts[-1]
               for item, price in (("glue stick", 28), ("ruler", 24), ("stapler", 17)))  # "rulers" read too
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Agent tasks" in report and "| specreason | latency | 1 | 4.0 | 3.0 |" in report


def test_an_agent_workload_without_its_loop_is_refused_naming_the_way_to_run_it(tmp_path):
    from stepspec.workflows.eval.bench import BenchSettings
    from stepspec.workflows.eval.bench_run import run_bench
    from stepspec.workflows.eval.rundir import BenchError

    spec = BenchSettings(dataset="agent-shop", limit=1, strategies=("target-only",))
    with pytest.raises(BenchError, match="'agent-shop' is an agent workload.*stepspec bench"):
        asyncio.run(run_bench(spec, tmp_path / "run", engines=(agent_script(("x",)), None)))
    assert not (tmp_path / "run").exists()


def test_a_reply_that_never_writes_a_blank_line_runs_to_max_tokens_instead_of_failing():
    from stepspec.orchestrator.budget import Budget
    from stepspec.orchestrator.reasoner import Reasoner

    rambling = ("I will think about the boxes and " * 40).strip()  # no blank line anywhere
    served = Reasoner(agent_script((rambling,)), strategy="target-only", budget=Budget(max_step_tokens=8))
    assert served.budget.max_cut_steps == 4  # a reasoning setup checks that steps are delimited
    with serving({"stepspec": served}) as url:
        reply = ask(url, max_tokens=48)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "length" and reply.json()["usage"]["completion_tokens"] == 48
    assert choice["message"]["content"].startswith("I will think about the boxes")  # one step, cut in pieces


def test_a_turn_that_writes_a_call_again_ends_there_and_returns_its_calls_once():
    from stepspec.orchestrator.budget import Budget
    from stepspec.orchestrator.reasoner import Reasoner

    twelve, four = fenced("multiply", a=12, b=13), fenced("multiply", a=4, b=13)  # 9 words each
    looping = "\n".join([twelve, four] + [twelve] * 40)  # the first call again and again, no blank line
    served = Reasoner(agent_script((looping,)), strategy="target-only", budget=Budget(max_step_tokens=30))
    with serving({"stepspec": served}) as url:
        reply = ask(url, max_tokens=600)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and body["stepspec"]["stop_reason"] == "action"
    assert [json.loads(c["function"]["arguments"])["a"] for c in choice["message"]["tool_calls"]] == [12, 4]
    assert body["usage"]["completion_tokens"] == 30  # ended at the first piece that repeats a call
