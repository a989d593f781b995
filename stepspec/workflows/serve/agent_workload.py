"""An agent workload's task solved as a user's agent would solve it: the OpenAI Agents
SDK's loop calling this package's serve app (the same FastAPI app ``stepspec serve``
runs, reached in-process through httpx's ASGI transport) with the task's tools.

A *turn* is one model request: the conversation so far and the tools go in, a reply with
tool calls (the SDK runs them and sends their results back) or the final answer comes
out. Each turn is one trace on the server; the task's trace chains them
(:meth:`stepspec.orchestrator.trace.Trace.chained`), and :class:`stepspec.workflows.eval.results.AgentRun`
keeps what the client saw: each turn's prompt tokens and round trip, the tools' time, and
each engine's prompt tokens over the task with those the prefix cache served.

Worked example (``agent-shop`` task 0, four turns): turn 1 reads 238 prompt tokens and
calls ``get_price("glue stick")``; turn 2 reads 285 (the call and its result added; the
first 238 can come from the prefix cache) and calls ``get_price("ruler")``; turn 3 calls
``get_price("stapler")``; turn 4 reasons from the three prices to the total.
"""

from __future__ import annotations

import json
import time

import httpx

from stepspec.orchestrator.reasoner import Reasoner
from stepspec.orchestrator.trace import Trace
from stepspec.workflows.eval.agent_tasks import TASK_SETS
from stepspec.workflows.eval.datasets import Problem
from stepspec.workflows.eval.results import AgentRun, AgentTurn
from stepspec.workflows.serve.app import build_app

SERVED_NAME = "stepspec"
MAX_TURNS = 10  # model requests per task; past it the task fails (the SDK's MaxTurnsExceeded)


async def solve_agent_task(reasoner: Reasoner, problem: Problem) -> tuple[Trace, AgentRun]:
    """Task ``problem`` of its agent workload, solved by the SDK's loop on ``reasoner``.
    A loop that fails (too many turns, a model error) is the task's ``error``; its turns
    so far are kept."""
    try:
        import agents
    except ImportError as e:
        raise ImportError("agent workloads run the OpenAI Agents SDK's loop: pip install 'stepspec[eval]'") from e
    from openai import AsyncOpenAI

    task = TASK_SETS[problem.dataset][0](problem.index)
    traces: list[Trace] = []
    run = AgentRun()

    async def sent(request: httpx.Request) -> None:
        request.extensions["sent"] = time.perf_counter()

    async def answered(response: httpx.Response) -> None:
        if not response.request.url.path.endswith("/chat/completions"):
            return
        body = json.loads(await response.aread())
        choice = (body.get("choices") or [{}])[0]
        run.turns.append(AgentTurn(
            prompt_tokens=(body.get("usage") or {}).get("prompt_tokens", 0),
            seconds=time.perf_counter() - response.request.extensions["sent"],
            finish_reason=choice.get("finish_reason"),
            tool_call_steps=(body.get("stepspec") or {}).get("tool_call_steps") or {},
            tool_calls=[c["function"]["name"] for c in (choice.get("message") or {}).get("tool_calls") or []]))

    @agents.function_tool
    def get_price(item: str) -> str:
        """The price of one unit of an item in the store, in dollars."""
        t0 = time.perf_counter()
        try:
            return task.price(item)
        finally:
            run.tool_seconds += time.perf_counter() - t0

    agents.set_tracing_disabled(True)  # the SDK would export its traces to OpenAI
    app = build_app({SERVED_NAME: reasoner}, on_trace=traces.append)
    engines = reasoner.engines_in_use()
    before = {role: e.stats() for role, e in engines.items()}
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://stepspec", timeout=None,
                             event_hooks={"request": [sent], "response": [answered]})
    client = AsyncOpenAI(base_url="http://stepspec/v1", api_key="none", max_retries=0, http_client=http)
    model = agents.OpenAIChatCompletionsModel(model=SERVED_NAME, openai_client=client)
    agent = agents.Agent(name=problem.dataset, tools=[get_price], model=model)  # the task is the prompt
    t0 = time.perf_counter()
    error = None
    try:
        await agents.Runner.run(agent, problem.question, max_turns=MAX_TURNS)
    except Exception as e:  # noqa: BLE001 - a failed loop is this task's result, with why
        error = f"{type(e).__name__}: {e}"
    finally:
        seconds = time.perf_counter() - t0
        await http.aclose()
    for role, engine in engines.items():
        now = engine.stats()
        run.prompt_tokens[role] = {"prompt": now.num_prompt_tokens - before[role].num_prompt_tokens,
                                   "cached": now.num_cached_prompt_tokens - before[role].num_cached_prompt_tokens}
    return Trace.chained(problem.question, traces, seconds, error), run
