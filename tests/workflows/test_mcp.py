"""Tools of an MCP stdio server (tests/support/mcp_tools_server.py, a real server over the
`mcp` package): listed as OpenAI function schemas, called from Python and from a YAML
workflow's agent in the model's tool format (scripted engines), a server that fails to
start or dies mid-run. Marked ``vllm``: the agent reads calls with vLLM's tool parsers."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from fake_engine import ScriptedEngine
from stepspec.workflows.agents.mcp import MCPServer, MCPServerError

pytestmark = pytest.mark.vllm

SERVER = [sys.executable, str(Path(__file__).resolve().parents[1] / "support" / "mcp_tools_server.py")]


def fenced(name: str, **arguments) -> str:
    return f'```json\n{json.dumps({"name": name, "arguments": arguments})}\n```'


def test_an_mcp_servers_tools_are_function_schemas_that_call_the_server_and_a_dead_server_is_an_observation():
    async def scenario():
        async with MCPServer("arithmetic", SERVER) as server:
            tools = {t.name: t for t in server.tools}
            assert sorted(tools) == ["add", "crash", "multiply"]
            schema = tools["multiply"].openai()["function"]
            assert schema["parameters"]["required"] == ["a", "b"] and schema["description"] == "Multiply two numbers."
            assert tools["multiply"].side_effect_free and not tools["crash"].side_effect_free  # readOnlyHint
            good = await tools["multiply"].call({"a": 6, "b": 7})
            bad = await tools["multiply"].call({"a": 6})
            crash = await tools["crash"].call({})
            after = await tools["add"].call({"a": 1, "b": 2})
            return good, bad, crash, after

    good, bad, crash, after = asyncio.run(scenario())
    assert good.ok and good.observation == "42.0"
    assert not bad.ok and "'b' is a required property" in bad.observation
    assert not crash.ok and "MCP server 'arithmetic'" in crash.observation
    assert not after.ok and "MCP server 'arithmetic'" in after.observation  # every later call says so too


@pytest.mark.parametrize("command, says", [
    (["/nonexistent/mcp-server"], "failed to start"),
    ([sys.executable, "-c", "import sys; print('no such database', file=sys.stderr); sys.exit(2)"],
     "its stderr ends: no such database"),
])
def test_an_mcp_server_that_cannot_start_is_an_error_naming_its_command(command, says):
    with pytest.raises(MCPServerError, match="MCP server 'broken'") as e:
        asyncio.run(MCPServer("broken", command, start_timeout=20).start())
    assert says in str(e.value) and command[0] in str(e.value)


def agent_engine(first_call: str) -> ScriptedEngine:
    """Writes ``first_call``, then the answer once the tool's result is in the chat."""
    def continuation(prompt: str) -> str:
        if "<|tool|>" in prompt:
            return "The product is \\boxed{%s}." % prompt.split("<|tool|>")[-1].split("\n")[0]
        return first_call

    return ScriptedEngine(continuation=continuation, renders_tools=True)


def test_an_agent_uses_an_mcp_servers_tools_in_the_models_tool_format_from_python():
    from stepspec.orchestrator.reasoner import Reasoner
    from stepspec.workflows.agents.agent import Agent

    async def scenario():
        async with MCPServer("arithmetic", SERVER) as server:
            reasoner = Reasoner(agent_engine(fenced("multiply", a=6, b=7)), strategy="target-only")
            return await Agent(reasoner, server.tools).arun("What is 6 times 7?"), reasoner.target.prompts

    result, prompts = asyncio.run(scenario())
    assert result.answer == "42.0" and [c.tool for c in result.tool_calls] == ["multiply"]
    assert '<|tools|>["multiply", "add", "crash"]' in prompts[0]
    assert ("tool", "42.0") in result.messages


WORKFLOW = f"""\
engines:
  target: {{backend: vllm, model: qwen2.5-coder-1.5b}}
reasoners:
  solver: {{target: target, strategy: target-only}}
mcp_servers:
  arithmetic: {{command: {json.dumps(SERVER)}, timeout: 5}}
agents:
  calc: {{reasoner: solver, tools: [arithmetic]}}
workflow:
  inputs: {{question: {{type: string}}}}
  nodes:
    a: {{agent: calc, task: "${{inputs.question}}"}}
  outputs: {{answer: "${{a.output}}"}}
"""


def test_a_yaml_agent_uses_an_mcp_server_and_validate_lists_its_tools(tmp_path):
    from typer.testing import CliRunner

    from stepspec.workflows.cli.app import app
    from stepspec.workflows.flows.runner import WorkflowRun
    from stepspec.workflows.flows.schema import load_workflow

    path = tmp_path / "wf.yaml"
    path.write_text(WORKFLOW)
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert "1 MCP servers" in r.output and "MCP server arithmetic: multiply, add, crash" in r.output

    run = WorkflowRun(load_workflow(path), engines={"target": agent_engine(fenced("multiply", a=6, b=7))})
    try:
        record = asyncio.run(run.run({"question": "six sevens?"}))
    finally:
        asyncio.run(run.close())
    a = record["nodes"]["a"]
    assert a["output"] == "42.0" and a["details"]["tool_calls"][0]["observation"] == "42.0"

    path.write_text(WORKFLOW.replace(json.dumps(SERVER), '["/nonexistent/server"]'))
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert r.exit_code != 0 and "wf.yaml:6: MCP server 'arithmetic'" in str(r.exception)
    assert "failed to start" in str(r.exception)
