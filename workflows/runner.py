"""Run a workflow file: build its engines, reasoners, tools and agents, then its graph.

Nodes run as soon as the nodes they read from are done, so independent nodes
run concurrently (and the engines batch their calls). A node that fails stops
the nodes that depend on it (``skipped``); every other node runs to the end,
and the run record keeps each finished node's output.

Node outputs: ``${node.output}`` is a reason or agent node's answer (its
``\\boxed{}`` value) when it has one, else its text; ``${node.text}`` the whole
text; ``${node.answer}`` the answer alone (empty when none). A tool node's
output is the tool's return value; a map node's is the list of its items'
outputs. A reference that is a whole string keeps the referenced value's type
(a list stays a list); inside a longer string it is written as text.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from engine.models import ModelError, resolve_model
from engine.protocol import Engine
from orchestrator.prompts import Chat
from orchestrator.reasoner import Reasoner
from orchestrator.run import Budget, ReasoningError
from orchestrator.steps import StepRules
from workflows.agent import Agent
from workflows.spec import (
    REF,
    AgentNode,
    LoadedWorkflow,
    MapNode,
    OpenAIEngineSpec,
    ReasonNode,
    ToolNode,
    VLLMEngineSpec,
    WorkflowError,
    node_references,
    references,
)
from workflows.tools import Tool, load_tool


@dataclass
class NodeRecord:
    status: str = "pending"  # pending, running, done, failed, skipped
    output: Any = None
    text: str | None = None
    answer: str | None = None
    error: str | None = None
    seconds: float | None = None
    details: dict[str, Any] = field(default_factory=dict)  # traces' stats, tool calls


def check_models(w: LoadedWorkflow, check_env: bool = True) -> list[str]:
    """Every vLLM engine's model resolves (a preset, a folder, or a hub id), before anything
    loads; with ``check_env``, every API key variable is set. Returns notes for the user
    (variables not set, when not checked)."""
    notes = []
    for name, e in w.spec.engines.items():
        if isinstance(e, VLLMEngineSpec):
            for key, model in (("model", e.model), ("draft_model", e.draft_model)):
                if model is None:
                    continue
                try:
                    resolve_model(model, auto_prepare=False)
                except ModelError as err:
                    if "is not prepared" in str(err):
                        continue  # a preset: prepared when the engine starts
                    raise WorkflowError(f"{w.where('engines', name, key)}: engine '{name}': {err}") from None
        elif isinstance(e, OpenAIEngineSpec) and e.api_key_env and not os.environ.get(e.api_key_env):
            message = (f"{w.where('engines', name, 'api_key_env')}: engine '{name}' reads its API key from "
                       f"${e.api_key_env}, which is not set; export it before the run")
            if check_env:
                raise WorkflowError(message)
            notes.append(message)
    return notes


def build_engine(name: str, e: VLLMEngineSpec | OpenAIEngineSpec) -> Engine:
    if isinstance(e, OpenAIEngineSpec):
        from engine.openai_backend import OpenAIEngine

        return OpenAIEngine(e.base_url, e.model, name=name, api_key_env=e.api_key_env, timeout_s=e.timeout_s,
                            max_model_len=e.max_model_len, tokenizer=e.tokenizer)
    from engine.speculation import speculative_config
    from engine.vllm_backend import VLLMEngine

    spec_config = e.speculative_config
    if e.speculation is not None:
        spec_config = speculative_config(e.speculation,
                                         draft_model=resolve_model(e.draft_model) if e.draft_model else None)
    elif spec_config and "model" in spec_config:  # a preset name for the token drafter
        spec_config = {**spec_config, "model": resolve_model(spec_config["model"])}
    return VLLMEngine(resolve_model(e.model), name=name, dtype=e.dtype, kv_cache_gib=e.kv_cache_gib,
                      max_model_len=e.max_model_len, speculative_config=spec_config)


class WorkflowRun:
    """The objects a workflow file describes, built (engines not yet started)."""

    def __init__(self, w: LoadedWorkflow, engines: dict[str, Engine] | None = None) -> None:
        s = w.spec
        self.w = w
        if engines is None:
            check_models(w)
            used = {r.target for r in s.reasoners.values()} | {r.draft for r in s.reasoners.values() if r.draft}
            engines = {name: build_engine(name, e) for name, e in s.engines.items() if name in used}
        self.engines = engines
        self.reasoners: dict[str, Reasoner] = {}
        self.system_prompts: dict[str, str | None] = {}
        for name, r in s.reasoners.items():
            self.system_prompts[name] = (w.read_prompt_file(r.system_prompt_file) if r.system_prompt_file
                                         else r.system_prompt)
            try:
                self.reasoners[name] = Reasoner(
                    engines[r.target], engines[r.draft] if r.draft else None, strategy=r.strategy, judge=r.judge,
                    judge_options=r.judge_options or None, router=r.router, router_options=r.router_options or None,
                    rules=StepRules(delimiter=r.delimiter),
                    budget=Budget(max_tokens=r.budget.max_tokens, max_steps=r.budget.max_steps,
                                  max_step_tokens=r.budget.max_step_tokens, max_seconds=r.budget.timeout),
                    **r.options)
            except ValueError as e:
                raise WorkflowError(f"{w.where('reasoners', name)}: reasoner '{name}': {e}") from None
        self.tools: dict[str, Tool] = {}
        for name, t in s.tools.items():
            try:
                self.tools[name] = load_tool(t.function, s.allowed_modules, name=name,
                                             side_effect_free=t.side_effect_free, timeout=t.timeout,
                                             description=t.description)
            except ValueError as e:
                raise WorkflowError(f"{w.where('tools', name)}: {e}") from None
        self.agents = {name: Agent(self.reasoners[a.reasoner], [self.tools[t] for t in a.tools],
                                   system_prompt=a.system_prompt, max_iterations=a.max_iterations,
                                   speculative_tools=a.speculative_tools,
                                   demonstration=[t.model_dump() for t in a.demonstration])
                       for name, a in s.agents.items()}

    async def close(self) -> None:
        for e in self.engines.values():
            await e.close()

    # -- running the graph ------------------------------------------------------------

    async def run(self, inputs: dict[str, Any], on_node: Callable[[str, NodeRecord], None] | None = None,
                  record_path: str | os.PathLike | None = None) -> dict[str, Any]:
        """Every node, concurrently where the graph allows; returns the run record, which is
        also written to ``record_path`` after each node (and on Ctrl-C: ``interrupted``)."""
        g = self.w.spec.workflow
        if g is None:
            raise WorkflowError(f"{self.w.path}: the file has no workflow: section to run")
        values = self._inputs(inputs)
        records = {name: NodeRecord() for name in g.nodes}
        done = {name: asyncio.Event() for name in g.nodes}
        t0 = time.perf_counter()

        def snapshot(status: str) -> dict[str, Any]:
            outputs: dict[str, Any] = {}
            for out, ref in g.outputs.items():
                deps = {r for r, _ in references(ref) if r in records}
                outputs[out] = self._fill(ref, values, records) if all(records[d].status == "done"
                                                                       for d in deps) else None
            record = {"workflow": str(self.w.path), "status": status, "inputs": values, "outputs": outputs,
                      "nodes": {n: asdict(r) for n, r in records.items()}, "seconds": time.perf_counter() - t0,
                      "written": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            if record_path is not None:
                write_record(record, record_path)
            return record

        async def node_task(name: str) -> None:
            node = g.nodes[name]
            deps = {ref for ref, _ in node_references(node) if ref not in ("inputs", "item")}
            for dep in deps:
                await done[dep].wait()
            rec = records[name]
            failed = [d for d in deps if records[d].status != "done"]
            if failed:
                rec.status, rec.error = "skipped", f"depends on {', '.join(sorted(failed))}, which did not finish"
            else:
                rec.status = "running"
                started = time.perf_counter()
                try:
                    await self._run_node(node, rec, values, records)
                    rec.status = "done"
                except Exception as e:  # the node failed: recorded, and its dependants skip
                    rec.status, rec.error = "failed", f"{type(e).__name__}: {e}"
                rec.seconds = time.perf_counter() - started
            done[name].set()
            snapshot("running")
            if on_node is not None:
                on_node(name, rec)

        try:
            for e in self.engines.values():
                await e.start()
            await asyncio.gather(*(node_task(n) for n in g.nodes))
        except BaseException:
            snapshot("interrupted")
            raise
        return snapshot("complete" if all(r.status == "done" for r in records.values()) else "failed")

    def _inputs(self, given: dict[str, Any]) -> dict[str, Any]:
        g = self.w.spec.workflow
        assert g is not None
        unknown = sorted(set(given) - set(g.inputs))
        if unknown:
            raise WorkflowError(f"{self.w.where('workflow', 'inputs')}: unknown input {', '.join(unknown)}; "
                                f"the workflow takes: {', '.join(g.inputs) or 'no inputs'}")
        values = {}
        for name, spec in g.inputs.items():
            if name in given:
                values[name] = _convert(name, given[name], spec.type)
            elif spec.default is not None:
                values[name] = spec.default
            else:
                raise WorkflowError(f"{self.w.where('workflow', 'inputs', name)}: input '{name}' is required: "
                                    f"--input {name}=...")
        return values

    def _fill(self, text: Any, inputs: dict[str, Any], records: dict[str, NodeRecord], item: Any = None) -> Any:
        """``text`` with its ${...} references replaced (a whole-string reference keeps its type)."""
        if isinstance(text, dict):
            return {k: self._fill(v, inputs, records, item) for k, v in text.items()}
        if isinstance(text, list):
            return [self._fill(v, inputs, records, item) for v in text]
        if not isinstance(text, str):
            return text

        def value(m) -> Any:
            if m.group(3):
                return item
            ref, field_name = m.group(1), m.group(2)
            if ref == "inputs":
                return inputs[field_name]
            rec = records[ref]
            return getattr(rec, field_name) if field_name != "output" else rec.output

        whole = REF.fullmatch(text.strip())
        if whole:
            return value(whole)
        return REF.sub(lambda m: _as_text(value(m)), text)

    async def _run_node(self, node: Any, rec: NodeRecord, inputs: dict[str, Any], records: dict[str, NodeRecord],
                        item: Any = None) -> None:
        def fill(text: Any) -> Any:
            return self._fill(text, inputs, records, item)

        if isinstance(node, MapNode):
            items = fill(node.map)
            if not isinstance(items, list):
                raise WorkflowError(f"map over {node.map}: expected a list, got {type(items).__name__}")
            gate = asyncio.Semaphore(node.concurrency)
            subs = [NodeRecord() for _ in items]

            async def one(i: int, it: Any) -> None:
                async with gate:
                    await self._run_node(node.node, subs[i], inputs, records, it)

            await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))
            rec.output = [s.output for s in subs]
            rec.text = "\n".join(_as_text(s.output) for s in subs)
            rec.details = {"items": [vars(s) for s in subs]}
            return
        if isinstance(node, ReasonNode):
            reasoner = self.reasoners[node.reason]
            question = _as_text(fill(node.prompt))
            system = self.system_prompts[node.reason]
            if system:
                question = Chat(question, [{"role": "system", "content": system}, {"role": "user", "content": question}])
            try:
                trace = (await reasoner.asolve(question)).trace
            except ReasoningError as e:
                rec.details = {"trace": json.loads(e.trace.to_json())}
                raise
            rec.text, rec.answer = trace.text, trace.answer
            rec.output = trace.answer if trace.answer is not None else trace.text
            rec.details = {"stats": trace.stats()}
            return
        if isinstance(node, AgentNode):
            result = await self.agents[node.agent].arun(_as_text(fill(node.task)))
            rec.text = "\n\n".join(content for _, content in result.messages[2:])  # thoughts and observations
            rec.answer = result.answer
            rec.output = result.answer if result.answer is not None else rec.text
            rec.details = {"stop_reason": result.stop_reason, "iterations": result.num_iterations,
                           "tool_calls": [asdict(c) for c in result.tool_calls],
                           "messages": [list(m) for m in result.messages[1:]]}  # the system prompt is in the file
            return
        assert isinstance(node, ToolNode)
        result = await self.tools[node.tool].call(fill(node.args))
        if not result.ok:
            raise RuntimeError(result.observation)
        rec.output, rec.text = result.value, result.observation
        rec.details = {"seconds": result.seconds}


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def _convert(name: str, raw: Any, kind: str) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        if kind == "number":
            return float(raw)
        if kind == "integer":
            return int(raw)
        if kind == "boolean":
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1", "yes")
        if kind == "list":
            value = json.loads(raw)
            if not isinstance(value, list):
                raise ValueError(raw)
            return value
    except (ValueError, json.JSONDecodeError):
        raise WorkflowError(f"input '{name}' should be a {kind}, got {raw!r}"
                            + (" (a JSON list, e.g. '[\"a\", \"b\"]')" if kind == "list" else "")) from None
    return raw


def write_record(record: dict[str, Any], path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str))
    tmp.replace(path)
    return path

