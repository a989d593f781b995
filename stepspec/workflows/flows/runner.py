"""Run a workflow file: build its engines, reasoners, tools and agents, then its graph.

Nodes run as soon as the nodes they read from are done, so independent nodes
run concurrently (and the engines batch their calls). A node that fails stops
the nodes that depend on it (``skipped``); every other node runs to the end,
and the run record keeps each finished node's output.

Node outputs: ``${node.output}`` is a reason or agent node's answer (its
``\\boxed{}`` value) when it has one, else its text; ``${node.text}`` the whole
text (an agent's: its final reply, never its calls or their results, empty where it ended
without one: ``details.stop_reason`` says why); ``${node.answer}`` the answer alone (empty when none). A tool node's
output is the tool's return value; a map node's is the list of its items'
outputs. A reference that is a whole string keeps the referenced value's type
(a list stays a list); inside a longer string it is written as text.

A map node keeps each item's record as it finishes (``details.items``, and the item
values in ``details.values``), and the run record is rewritten then. An item that fails
does not stop the others, but one that finds its engine gone
(:class:`stepspec.engine.protocol.EngineUnavailableError`) stops the items not yet started, as
they would fail the same way; the node then fails with how many of its items finished.

Resuming (``WorkflowRun.run(..., resume=record)``, ``stepspec run FILE --resume
RECORD``): the record must come from the same workflow (its content, engine addresses
aside: :func:`workflow_digest`) and the same inputs. Nodes that were done keep their
record and do not run; a map node runs only the items that were not done.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from stepspec.common.files import atomic_write_json
from stepspec.common.states import RunStatus
from stepspec.engine.config import OpenAIEngineConfig, VLLMEngineConfig, build_engine, check_model
from stepspec.engine.models import ModelError
from stepspec.engine.protocol import Engine, EngineUnavailableError
from stepspec.judges.base import JudgeError
from stepspec.judges.registry import JUDGES, judge_options
from stepspec.orchestrator.prompts import Chat
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.reasoner import Reasoner, check_reasoner
from stepspec.orchestrator.run import ReasoningError
from stepspec.orchestrator.strategies import STRATEGIES, StrategyError
from stepspec.routers.base import RouterError
from stepspec.workflows.agents.agent import Agent
from stepspec.workflows.eval.results import SCHEMA_VERSION, check_schema
from stepspec.workflows.flows.schema import (
    REF,
    AgentNode,
    LoadedWorkflow,
    MapNode,
    ReasonerEntry,
    ReasonNode,
    ToolNode,
    WorkflowError,
    node_references,
    references,
)
from stepspec.workflows.agents.mcp import MCPServer, MCPServerError
from stepspec.workflows.agents.tools import Tool, load_tool


class NodeStatus(str, enum.Enum):
    """Where a node (or a map node's item) stands in a run record."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"  # a node: one it reads from did not finish; an item: not started


class MapError(RuntimeError):
    """Some of a map node's items did not finish (each item's error is in its record)."""


@dataclass
class NodeRecord:
    status: NodeStatus = NodeStatus.PENDING
    output: Any = None
    text: str | None = None
    answer: str | None = None
    error: str | None = None
    seconds: float | None = None
    details: dict[str, Any] = field(default_factory=dict)  # traces' stats, tool calls


def check_workflow(w: LoadedWorkflow, check_env: bool = True) -> list[str]:
    """Every name a loaded workflow file uses resolves, before any model is prepared or
    engine starts: models (:func:`check_models`), each reasoner's strategy, judge, router and
    their options (:func:`check_reasoners`), and each tool's function (:func:`load_tools`).
    ``stepspec validate`` and ``stepspec run`` call it first. Returns notes for the user."""
    notes = check_models(w, check_env=check_env)
    check_reasoners(w)
    load_tools(w)  # imports each tool's module (an allowed one only) and finds its function
    return notes


def check_models(w: LoadedWorkflow, check_env: bool = True) -> list[str]:
    """Every vLLM engine's model resolves (a preset, a folder, or a hub id), before anything
    loads; with ``check_env``, every API key variable is set. Returns notes for the user
    (variables not set, when not checked)."""
    notes = []
    for name, e in w.spec.engines.items():
        if isinstance(e, VLLMEngineConfig):
            for where, model in e.models().items():
                try:
                    check_model(model)
                except ModelError as err:
                    raise WorkflowError(f"{w.where('engines', name, *where)}: engine '{name}': {err}") from None
        elif isinstance(e, OpenAIEngineConfig) and e.api_key_env and not os.environ.get(e.api_key_env):
            message = (f"{w.where('engines', name, 'api_key_env')}: engine '{name}' reads its API key from "
                       f"${e.api_key_env}, which is not set; export it before the run")
            if check_env:
                raise WorkflowError(message)
            notes.append(message)
    return notes


def check_reasoners(w: LoadedWorkflow) -> None:
    """Each reasoner's strategy, judge, router and their options resolve (with the closest
    valid name), and fit together (a strategy that drafts has a draft engine; one that takes
    no judge is given none), without loading anything but a router file."""
    for name, r in w.spec.reasoners.items():
        try:
            check_reasoner(r.config(w.spec.engines))
        except (ValueError, TypeError) as e:
            raise WorkflowError(f"{_reasoner_error_place(w, name, r, e)}: reasoner '{name}': {e}") from None


def _reasoner_error_place(w: LoadedWorkflow, name: str, r: ReasonerEntry, e: Exception) -> str:
    """file:line of the key a reasoner's configuration error is about."""
    at = ("reasoners", name)
    if isinstance(e, StrategyError):
        if r.strategy in STRATEGIES:
            unknown = [k for k in r.options if k not in STRATEGIES[r.strategy].options]
            if unknown:
                return w.where(*at, "options", unknown[0])
        return w.where(*at, "strategy")
    if isinstance(e, JudgeError):
        strategy = STRATEGIES.get(r.strategy)
        judge = r.judge or (strategy.default_judge if strategy else None)
        if judge in JUDGES:
            unknown = [k for k in r.judge_options if k not in judge_options(judge)]
            if unknown:
                return w.where(*at, "judge_options", unknown[0])
        return w.where(*at, "judge" if r.judge is not None or not r.judge_options else "judge_options")
    if isinstance(e, RouterError):
        return w.where(*at, "router" if r.router is not None or not r.router_options else "router_options")
    if isinstance(e, TypeError):
        return w.where(*at, "options")
    return w.where(*at)


def mcp_servers(w: LoadedWorkflow) -> dict[str, MCPServer]:
    """The file's MCP servers, not yet started (a relative ``cwd`` is the YAML file's)."""
    base = Path(w.path).parent
    return {name: MCPServer(name, m.command, env=m.env, cwd=str(base / m.cwd) if m.cwd else None,
                            side_effect_free=m.side_effect_free, **({"timeout": m.timeout} if m.timeout else {}))
            for name, m in w.spec.mcp_servers.items()}


async def list_mcp_tools(w: LoadedWorkflow) -> dict[str, list[Tool]]:
    """Each MCP server's tools: the server started, listed and stopped (``stepspec validate``)."""
    listed = {}
    for name, server in mcp_servers(w).items():
        try:
            listed[name] = await start_mcp_server(w, name, server)
        finally:
            await server.close()
    return listed


async def start_mcp_server(w: LoadedWorkflow, name: str, server: MCPServer) -> list[Tool]:
    """``server`` started, its tools listed; one that cannot start is a :class:`WorkflowError`
    at its place in the file."""
    try:
        return await server.start()
    except MCPServerError as e:
        raise WorkflowError(f"{w.where('mcp_servers', name)}: {e}") from None


def load_tools(w: LoadedWorkflow) -> dict[str, Tool]:
    """Each tool of the file, imported (from its allowed module only); a function the module
    does not hold is an error with the closest name it does."""
    s = w.spec
    tools: dict[str, Tool] = {}
    for name, t in s.tools.items():
        try:
            tools[name] = load_tool(t.function, s.allowed_modules, name=name, side_effect_free=t.side_effect_free,
                                    timeout=t.timeout, description=t.description)
        except ValueError as e:
            raise WorkflowError(f"{w.where('tools', name, 'function')}: {e}") from None
    return tools


def check_inputs(w: LoadedWorkflow, given: dict[str, Any]) -> dict[str, Any]:
    """The workflow's input values from ``given`` (strings converted to each input's type,
    defaults filled in); an unknown, missing or mistyped input is an error."""
    g = w.spec.workflow
    if g is None:
        raise WorkflowError(f"{w.path}: the file has no workflow: section to run")
    unknown = sorted(set(given) - set(g.inputs))
    if unknown:
        raise WorkflowError(f"{w.where('workflow', 'inputs')}: unknown input {', '.join(unknown)}; "
                            f"the workflow takes: {', '.join(g.inputs) or 'no inputs'}")
    values = {}
    for name, spec in g.inputs.items():
        if name in given:
            values[name] = _convert(name, given[name], spec.type)
        elif spec.default is not None:
            values[name] = spec.default
        else:
            raise WorkflowError(f"{w.where('workflow', 'inputs', name)}: input '{name}' is required: "
                                f"--input {name}=...")
    return values


class WorkflowRun:
    """The objects a workflow file describes, built (engines not yet started)."""

    def __init__(self, w: LoadedWorkflow, engines: dict[str, Engine] | None = None) -> None:
        s = w.spec
        self.w = w
        if engines is None:
            check_workflow(w)  # every name resolves before any model is prepared
            used = {r.target for r in s.reasoners.values()} | {r.draft for r in s.reasoners.values() if r.draft}
            engines = {name: build_engine(name, e) for name, e in s.engines.items() if name in used}
        self.engines = engines
        self.reasoners: dict[str, Reasoner] = {}
        self.system_prompts: dict[str, str | None] = {}
        for name, r in s.reasoners.items():
            self.system_prompts[name] = (w.read_prompt_file(r.system_prompt_file) if r.system_prompt_file
                                         else r.system_prompt)
            try:
                self.reasoners[name] = Reasoner.from_config(
                    r.config(s.engines), engines=(engines[r.target], engines[r.draft] if r.draft else None))
            except (ValueError, TypeError) as e:
                raise WorkflowError(f"{_reasoner_error_place(w, name, r, e)}: reasoner '{name}': {e}") from None
        self.tools: dict[str, Tool] = load_tools(w)
        self.mcp_servers = mcp_servers(w)
        self.agents: dict[str, Agent] = {}  # built once their MCP servers list their tools (open)

    async def open(self) -> None:
        """Start the MCP servers (their tools become the agents'), then build the agents."""
        for name, server in self.mcp_servers.items():
            await start_mcp_server(self.w, name, server)
        for name, a in self.w.spec.agents.items():
            tools = [t for ref in a.tools for t in (self.mcp_servers[ref].tools if ref in self.mcp_servers
                                                    else [self.tools[ref]])]
            self.agents[name] = Agent(self.reasoners[a.reasoner], tools, system_prompt=a.system_prompt,
                                      max_iterations=a.max_iterations, speculative_tools=a.speculative_tools,
                                      demonstration=[t.message() for t in a.demonstration],
                                      tool_format=a.tool_format)

    async def close(self) -> None:
        for server in self.mcp_servers.values():
            await server.close()
        for e in self.engines.values():
            await e.close()

    # -- running the graph ------------------------------------------------------------

    async def run(self, inputs: dict[str, Any], on_node: Callable[[str, NodeRecord], None] | None = None,
                  record_path: str | os.PathLike | None = None, resume: dict[str, Any] | None = None,
                  on_item: Callable[[str, int, NodeRecord], None] | None = None) -> dict[str, Any]:
        """Every node, concurrently where the graph allows; returns the run record, which is
        also written to ``record_path`` after each node and each map item (and on Ctrl-C:
        ``interrupted``). ``on_node(name, record)`` is called as each node ends,
        ``on_item(name, index, record)`` as each map item that ran ends.

        ``resume``: an earlier run record of this workflow (see :func:`load_record`), with
        the same inputs (else a :class:`WorkflowError` naming the difference): its done
        nodes and done map items are kept as they are, and only the rest run."""
        g = self.w.spec.workflow
        if g is None:
            raise WorkflowError(f"{self.w.path}: the file has no workflow: section to run")
        values = check_inputs(self.w, inputs)
        digest = workflow_digest(self.w)
        records = {name: NodeRecord() for name in g.nodes} if resume is None else resumed_records(self.w, resume, values)
        done = {name: asyncio.Event() for name in g.nodes}
        t0 = time.perf_counter()
        error: list[str] = []  # why the run stopped before its nodes ran

        def snapshot(status: RunStatus) -> dict[str, Any]:
            record = {"schema_version": SCHEMA_VERSION, "workflow": str(self.w.path), "workflow_digest": digest,
                      "status": status,
                      "inputs": values, "outputs": self._outputs(values, records),
                      "nodes": {n: asdict(r) for n, r in records.items()}, "seconds": time.perf_counter() - t0,
                      "written": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            if resume is not None:
                record["resumed"] = int(resume.get("resumed", 0)) + 1  # how many runs continued this record
            if error:
                record["error"] = error[0]
            if record_path is not None:
                write_record(record, record_path)
            return record

        async def node_task(name: str) -> None:
            rec = records[name]
            if rec.status == NodeStatus.DONE:  # resumed: kept as it was
                done[name].set()
                return
            node = g.nodes[name]
            deps = {ref for ref, _ in node_references(node) if ref not in ("inputs", "item")}
            for dep in deps:
                await done[dep].wait()
            failed = [d for d in deps if records[d].status != NodeStatus.DONE]
            if failed:
                rec.status, rec.error = NodeStatus.SKIPPED, f"depends on {', '.join(sorted(failed))}, which did not finish"
            else:
                def item_done(index: int, item: NodeRecord) -> None:
                    snapshot(RunStatus.RUNNING)
                    if on_item is not None:
                        on_item(name, index, item)

                await self._timed_node(node, rec, values, records, item_done)
            done[name].set()
            snapshot(RunStatus.RUNNING)
            if on_node is not None:
                on_node(name, rec)

        try:
            if any(r.status != NodeStatus.DONE for r in records.values()):  # a finished record starts nothing
                for e in self.engines.values():
                    await e.start()
            await self.open()
            await asyncio.gather(*(node_task(n) for n in g.nodes))
        except (KeyboardInterrupt, asyncio.CancelledError):
            snapshot(RunStatus.INTERRUPTED)
            raise
        except BaseException as e:
            error.append(f"{type(e).__name__}: {e}")
            snapshot(RunStatus.FAILED)
            raise
        return snapshot(RunStatus.COMPLETE if all(r.status == NodeStatus.DONE for r in records.values())
                        else RunStatus.FAILED)

    def _outputs(self, values: dict[str, Any], records: dict[str, NodeRecord]) -> dict[str, Any]:
        """The workflow's outputs: each filled in once every node it names is done, else None."""
        outputs: dict[str, Any] = {}
        for out, ref in self.w.spec.workflow.outputs.items():
            deps = {r for r, _ in references(ref) if r in records}
            outputs[out] = self._fill(ref, values, records) if all(records[d].status == NodeStatus.DONE
                                                                   for d in deps) else None
        return outputs

    async def _timed_node(self, node: Any, rec: NodeRecord, values: dict[str, Any], records: dict[str, NodeRecord],
                          item_done: Callable[[int, NodeRecord], None]) -> None:
        """Run a node into its record: done, or failed with the error (its dependants then skip); its seconds."""
        rec.status = NodeStatus.RUNNING
        started = time.perf_counter()
        try:
            await self._run_node(node, rec, values, records, item_done=item_done)
            rec.status = NodeStatus.DONE
        except Exception as e:  # the node failed: recorded, and its dependants skip
            rec.status, rec.error = NodeStatus.FAILED, f"{type(e).__name__}: {e}"
        rec.seconds = time.perf_counter() - started

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
                        item: Any = None, item_done: Callable[[int, NodeRecord], None] | None = None) -> None:
        def fill(text: Any) -> Any:
            return self._fill(text, inputs, records, item)

        if isinstance(node, MapNode):
            await self._run_map(node, rec, fill(node.map), inputs, records, item_done)
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
            rec.text = result.output or ""  # its final reply; empty where it ended without one (stop_reason)
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


    async def _run_map(self, node: MapNode, rec: NodeRecord, items: Any, inputs: dict[str, Any],
                       records: dict[str, NodeRecord], item_done: Callable[[int, NodeRecord], None] | None) -> None:
        """Each item through the inner node, ``node.concurrency`` at a time, each item's
        record kept in ``rec.details`` as it ends (then ``item_done(index, record)``). Items
        already done in ``rec.details`` (a resumed run) with the same value are kept, not run."""
        if not isinstance(items, list):
            raise WorkflowError(f"map over {node.map}: expected a list, got {type(items).__name__}")
        old_values = rec.details.get("values") or []
        old_items = rec.details.get("items") or []
        subs = [old_items[i] if (i < len(old_items) and i < len(old_values) and old_items[i].status == NodeStatus.DONE
                                 and _as_json(old_values[i]) == _as_json(it)) else NodeRecord()
                for i, it in enumerate(items)]
        rec.details = {"values": items, "items": subs}
        gate = asyncio.Semaphore(node.concurrency)
        failures: list[int] = []  # the failed items, in the order they failed
        stopped: list[str] = []  # why the items not yet started will not start

        async def one(i: int, it: Any) -> None:
            sub = subs[i]
            if sub.status == NodeStatus.DONE:
                return
            async with gate:
                if stopped:
                    sub.status, sub.error = NodeStatus.SKIPPED, stopped[0]
                    return
                sub.status = NodeStatus.RUNNING
                started = time.perf_counter()
                try:
                    await self._run_node(node.node, sub, inputs, records, it)
                    sub.status = NodeStatus.DONE
                except Exception as e:  # this item failed; the others go on
                    sub.status, sub.error = NodeStatus.FAILED, f"{type(e).__name__}: {e}"
                    failures.append(i)
                    if _engine_unavailable(e) and not stopped:
                        stopped.append(f"not started: item {i} found its engine unavailable, so every item "
                                       "would fail the same way")
                sub.seconds = time.perf_counter() - started
                if item_done is not None:
                    item_done(i, sub)

        await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))
        finished = sum(s.status == NodeStatus.DONE for s in subs)
        if finished < len(subs):
            not_started = sum(s.status == NodeStatus.SKIPPED for s in subs)
            first = failures[0]
            raise MapError(f"{finished} of {len(subs)} items finished ({len(failures)} failed"
                           + (f", {not_started} not started" if not_started else "")
                           + f"; each item's record is in details.items); the first error, item {first} "
                             f"({_preview(items[first])}): {subs[first].error}")
        rec.output = [s.output for s in subs]
        rec.text = "\n".join(_as_text(s.output) for s in subs)


def resumed_records(w: LoadedWorkflow, resume: dict[str, Any], values: dict[str, Any]) -> dict[str, NodeRecord]:
    """The node records a run of ``w`` resuming the record ``resume`` starts from (``values``:
    the inputs, checked by :func:`check_inputs`): done nodes as they were, a map node's items
    kept (its done ones are not run again), every other node pending. A record of another
    workflow, of a changed one, or of other inputs is a :class:`WorkflowError`; nothing is
    loaded, so ``stepspec run --resume`` checks it before any model is prepared."""
    g = w.spec.workflow
    if g is None:
        raise WorkflowError(f"{w.path}: the file has no workflow: section to run")
    if resume.get("workflow_digest") != workflow_digest(w):
        where = resume.get("workflow")
        if where is not None and Path(where).resolve() == Path(w.path).resolve():
            why = "the file has changed since the record was written"
        else:
            why = f"it was written by {where}, another workflow (or this file as it was before a change)"
        raise WorkflowError(f"{w.path}: cannot resume this record: {why}; run the workflow that wrote it, "
                            "or run this one without --resume")
    before = _as_json(resume.get("inputs"))
    now = _as_json(values)
    if before != now:
        names = sorted(k for k in set(before or {}) | set(now) if (before or {}).get(k) != now.get(k))
        diffs = "; ".join(f"{k}: given {_preview(now.get(k))}, the record has {_preview((before or {}).get(k))}"
                          for k in names)
        raise WorkflowError(f"{w.path}: cannot resume this record: its inputs differ ({diffs}); give the "
                            "record's inputs (or none: `stepspec run --resume` reads them from the record), or "
                            "run without --resume")
    old_nodes = resume.get("nodes") or {}
    records = {}
    for name, node in g.nodes.items():
        old = old_nodes.get(name)
        if old is None:
            records[name] = NodeRecord()
            continue
        try:
            rec = NodeRecord(**{**old, "status": NodeStatus(old["status"])})
            items = [NodeRecord(**{**i, "status": NodeStatus(i["status"])})
                     for i in (rec.details.get("items") or [])] if isinstance(node, MapNode) else []
        except (TypeError, KeyError, ValueError) as e:
            raise WorkflowError(f"{w.path}: cannot resume this record: node '{name}' is not a node record "
                                f"({type(e).__name__}: {e}); run without --resume") from None
        if rec.status == NodeStatus.DONE:
            if items:
                rec.details = {**rec.details, "items": items}
            records[name] = rec
        elif isinstance(node, MapNode) and items:  # its done items are kept for the map to reuse
            records[name] = NodeRecord(details={"values": rec.details.get("values"), "items": items})
        else:
            records[name] = NodeRecord()
    return records


def _engine_unavailable(e: BaseException) -> bool:
    """Whether ``e`` was caused (anywhere in its chain) by an engine that stopped answering."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, EngineUnavailableError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _as_json(value: Any) -> Any:
    """``value`` as a JSON round trip would give it back (what a record holds)."""
    return json.loads(json.dumps(value, default=str))


def _preview(value: Any, width: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def workflow_digest(w: LoadedWorkflow) -> str:
    """A digest of what a workflow computes: its whole spec (and its reasoners' system
    prompt files) except how engines are reached (base_url, timeout_s, api_key_env), so
    that a server restarted at a new address can still resume a run."""
    spec = w.spec.model_dump(mode="json")
    for engine in (spec.get("engines") or {}).values():
        for key in ("base_url", "timeout_s", "api_key_env"):
            engine.pop(key, None)
        if engine.get("max_num_seqs") == VLLMEngineConfig.model_fields["max_num_seqs"].default:
            del engine["max_num_seqs"]  # newer than the first records: at its default, left out as then
    for r in (spec.get("reasoners") or {}).values():  # the budget as files spell it (and records did)
        budget, default = r["budget"], Budget().model_dump(mode="json")
        r["budget"] = {"max_tokens": budget["max_tokens"], "max_steps": budget["max_steps"],
                       "max_step_tokens": budget["max_step_tokens"], "timeout": budget["max_seconds"],
                       **{k: v for k, v in budget.items() if k == "max_cut_steps" and v != default[k]}}
    prompts = {name: w.read_prompt_file(r.system_prompt_file)
               for name, r in w.spec.reasoners.items() if r.system_prompt_file}
    text = json.dumps({"spec": spec, "system_prompt_files": prompts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_record(path: str | os.PathLike) -> dict[str, Any]:
    """A run record written by :meth:`WorkflowRun.run`, to resume; a missing or unreadable
    file is a :class:`WorkflowError` saying which."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise WorkflowError(f"{path}: no such run record; give the record a run wrote "
                            "(`stepspec run` prints its path)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WorkflowError(f"{path}: not a readable run record ({type(e).__name__}: {e})") from None
    if not isinstance(record, dict) or not isinstance(record.get("nodes"), dict):
        raise WorkflowError(f"{path}: not a run record (no nodes); give the record a `stepspec run` wrote")
    check_schema(record, f"{path} (a run record)", f"migrate it once with `stepspec bench migrate "
                 f"--record {path}`, or run the workflow without --resume", WorkflowError)
    return record


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
    atomic_write_json(path, record, default=str)
    return path

