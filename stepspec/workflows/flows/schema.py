"""YAML workflow files: engines, reasoners, tools, agents and a workflow graph.

A file is read with YAML's safe loader (no tags, no code runs) and validated
by the pydantic models below (``extra="forbid"`` everywhere). Everything that
can be wrong is reported before any model loads, with the YAML line and, for
a misspelt name, the closest valid one:

* a YAML syntax error, a key given twice in one mapping (at any depth; plain YAML
  would keep the last value without a word), an unknown key, a value of the wrong type;
* a reference to an engine, reasoner, tool or agent that the file does not define;
* a literal API key (keys come from an environment variable the file names);
* a tool outside the modules the file allows (``allowed_modules``);
* a ``${node.output}`` reference to a node that does not exist, or a cycle.

A minimal file::

    engines:
      target: {backend: vllm, model: qwen2.5-coder-1.5b}
      draft: {backend: vllm, model: qwen2.5-coder-0.5b}
    reasoners:
      solver: {target: target, draft: draft, strategy: specreason}
    workflow:
      inputs: {question: {type: string}}
      nodes:
        solve: {reason: solver, prompt: "${inputs.question}"}
      outputs: {answer: "${solve.output}"}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Union

import yaml
from pydantic import BaseModel, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from stepspec.common.options import Frozen
from stepspec.common.yaml_files import YamlFileError, parse_yaml
from stepspec.common.names import closest
from stepspec.engine.config import EngineConfig
from stepspec.orchestrator.config import ReasonerConfig, ReasonerSettings

REF = re.compile(r"\$\{([A-Za-z_][\w-]*)\.([A-Za-z_]\w*)\}|\$\{(item)\}")
NODE_FIELDS = ("output", "text", "answer")  # what ${node.FIELD} may read


class WorkflowError(ValueError):
    """A workflow file is wrong; the message names the file, the line and the fix."""


# -- reasoners (engines are stepspec.engine.config's EngineConfig), tools, agents -------------------


class ReasonerEntry(ReasonerSettings):
    """A reasoner of the file: the settings of :class:`stepspec.orchestrator.config.ReasonerSettings`
    (strategy, options, judge, router, budget, delimiter), its engines by name, and the
    system prompt of its reasoning chat."""

    target: str = Field(description="Engine name.")
    draft: str | None = Field(None, description="Engine name (strategies that draft steps).")
    system_prompt: str | None = Field(None, description="Inline system prompt of the reasoning chat.")
    system_prompt_file: str | None = Field(None, description="A file holding it (relative to the YAML file).")

    @model_validator(mode="after")
    def _one_prompt(self) -> "ReasonerEntry":
        if self.system_prompt is not None and self.system_prompt_file is not None:
            raise ValueError("give system_prompt or system_prompt_file, not both")
        return self

    def config(self, engines: Mapping[str, EngineConfig]) -> ReasonerConfig:
        """The reasoner's :class:`stepspec.orchestrator.config.ReasonerConfig`, its engines from ``engines``."""
        return ReasonerConfig(target=engines[self.target], draft=engines[self.draft] if self.draft else None,
                              **{name: getattr(self, name) for name in ReasonerSettings.model_fields})


class ToolEntry(Frozen):
    function: str = Field(description="module:function, from a module listed in allowed_modules.")
    side_effect_free: bool | None = Field(
        None, description="May run speculatively, before the step is accepted (default: the decorator's).")
    timeout: float | None = Field(None, gt=0, description="Seconds (default: the decorator's, else 10).")
    description: str | None = None

    @field_validator("function")
    @classmethod
    def _module_function(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", v):
            raise ValueError(f"'{v}' is not module:function (e.g. stepspec.workflows.examples.tools:calculator)")
        return v


class MCPServerEntry(Frozen):
    """A stdio MCP server stepspec starts and stops; its tools are tools like any other."""

    command: list[str] = Field(min_length=1, description="The program and its arguments, e.g. [python, server.py].")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables added for the server.")
    cwd: str | None = Field(None, description="Its working directory (relative to the YAML file).")
    side_effect_free: list[str] = Field(default_factory=list, description="Tools that may run speculatively "
                                        "(beside those the server marks read-only).")
    timeout: float | None = Field(None, gt=0, description="Seconds per call (default 10).")


class DemoCall(Frozen):
    """A call in a demonstration's assistant turn (template tool format)."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class DemoTurn(Frozen):
    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[DemoCall] = Field(default_factory=list, description="An assistant's calls (template format).")
    tool_call_id: str | None = Field(None, description="The call a tool turn answers.")

    def message(self) -> dict[str, Any]:
        """As a chat message the template reads."""
        m: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            m["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                               for c in self.tool_calls]
        if self.tool_call_id is not None:
            m["tool_call_id"] = self.tool_call_id
        return m


class AgentEntry(Frozen):
    reasoner: str
    tools: list[str] = Field(default_factory=list, description="Names of tools, or of MCP servers (all their tools).")
    tool_format: Literal["auto", "template", "text"] = Field(
        "auto", description="template: the model's own tool format (its chat template renders the tools); text: "
        "Action: lines; auto: template where the model's template renders tools.")
    system_prompt: str | None = None
    max_iterations: int = Field(8, ge=1)
    speculative_tools: bool = Field(True, description="Run side-effect-free tools as soon as the draft calls them.")
    demonstration: list[DemoTurn] = Field(default_factory=list, description="A worked exchange shown before the "
                                          "task: user and assistant turns.")


# -- the workflow graph ----------------------------------------------------------------


class InputField(Frozen):
    type: Literal["string", "number", "integer", "boolean", "list"] = "string"
    default: Any = None
    description: str | None = None


class ReasonNode(Frozen):
    reason: str = Field(description="Reasoner name.")
    prompt: str = Field(description="The question, with ${...} references.")


class AgentNode(Frozen):
    agent: str = Field(description="Agent name.")
    task: str = Field(description="The task, with ${...} references.")


class ToolNode(Frozen):
    tool: str = Field(description="Tool name.")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments; strings may hold ${...} references.")


NODE_KINDS = ("reason", "agent", "tool", "map")


def _node_kind(value: Any) -> str | None:
    """Which kind of node a mapping is: the one of reason/agent/tool/map it holds."""
    if isinstance(value, BaseModel):
        return next(k for k in NODE_KINDS if k in type(value).model_fields)
    if isinstance(value, dict):
        kinds = [k for k in NODE_KINDS if k in value]
        return kinds[0] if len(kinds) == 1 else None
    return None


InnerNode = Annotated[Union[Annotated[ReasonNode, Tag("reason")], Annotated[AgentNode, Tag("agent")],
                            Annotated[ToolNode, Tag("tool")]],
                      Discriminator(_node_kind, custom_error_type="node_kind",
                                    custom_error_message="a node holds exactly one of reason:, agent:, tool: "
                                                         "(and map: around one of them)")]


class MapNode(Frozen):
    map: str = Field(description="A ${...} reference to a list; the inner node runs once per item (${item}).")
    node: InnerNode
    concurrency: int = Field(4, ge=1)


Node = Annotated[Union[Annotated[ReasonNode, Tag("reason")], Annotated[AgentNode, Tag("agent")],
                       Annotated[ToolNode, Tag("tool")], Annotated[MapNode, Tag("map")]],
                 Discriminator(_node_kind, custom_error_type="node_kind",
                               custom_error_message="a node holds exactly one of reason:, agent:, tool:, map:")]


class WorkflowGraph(Frozen):
    inputs: dict[str, InputField] = Field(default_factory=dict)
    nodes: dict[str, Node]
    outputs: dict[str, str] = Field(default_factory=dict, description="Name -> a ${node.output} reference.")


class WorkflowFile(Frozen):
    version: Literal[1] = 1
    engines: dict[str, EngineConfig] = Field(default_factory=dict)
    reasoners: dict[str, ReasonerEntry] = Field(default_factory=dict)
    allowed_modules: list[str] = Field(default_factory=list, description="Modules tools may come from.")
    tools: dict[str, ToolEntry] = Field(default_factory=dict)
    mcp_servers: dict[str, MCPServerEntry] = Field(default_factory=dict, description="MCP stdio servers; an "
                                                   "agent's tools may name one (all its tools).")
    agents: dict[str, AgentEntry] = Field(default_factory=dict)
    workflow: WorkflowGraph | None = None


# -- loading with line numbers ----------------------------------------------------------


class _Lines:
    """YAML line (1-based) of every mapping key and sequence item, by path."""

    def __init__(self, node: yaml.Node | None) -> None:
        self.lines: dict[tuple, int] = {}
        if node is not None:
            self._walk(node, ())

    def _walk(self, node: yaml.Node, path: tuple) -> None:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                self.lines[path + (key.value,)] = key.start_mark.line + 1
                self._walk(value, path + (key.value,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, path + (i,))

    def line(self, path: tuple) -> int | None:
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())


def _closest(name: str, choices) -> str:
    match = closest(name, choices, cutoff=0.5)
    return f"; did you mean '{match}'?" if match else ""


class LoadedWorkflow:
    """A validated workflow file, where it came from, and its lines (for later errors)."""

    def __init__(self, spec: WorkflowFile, path: Path, lines: _Lines) -> None:
        self.spec, self.path, self._lines = spec, path, lines

    def where(self, *path: Any) -> str:
        line = self._lines.line(path)
        return f"{self.path}:{line}" if line else str(self.path)

    def read_prompt_file(self, relative: str) -> str:
        file = (self.path.parent / relative)
        if not file.is_file():
            raise WorkflowError(f"{self.where('reasoners')}: prompt file {file} does not exist")
        return file.read_text()


def load_workflow(path: str | Path, text: str | None = None) -> LoadedWorkflow:
    """Read, validate and cross-check a workflow file (``text``: its content, for tests)."""
    path = Path(path)
    if text is None:
        if not path.is_file():
            raise WorkflowError(f"{path}: no such workflow file")
        text = path.read_text()
    try:
        node, data = parse_yaml(path, text)
    except YamlFileError as e:
        raise WorkflowError(str(e)) from None
    lines = _Lines(node)
    if data is None:
        raise WorkflowError(f"{path}: the file is empty; see `stepspec schema` for what a workflow file holds")
    if not isinstance(data, dict):
        raise WorkflowError(f"{path}:1: a workflow file is a mapping (engines:, reasoners:, ...), not a "
                            f"{type(data).__name__}")
    try:
        spec = WorkflowFile.model_validate(data)
    except ValidationError as e:
        raise WorkflowError(_explain(e, path, lines, data)) from None
    loaded = LoadedWorkflow(spec, path, lines)
    check_references(loaded)
    return loaded


def _explain(e: ValidationError, path: Path, lines: _Lines, data: dict) -> str:
    """The first error of a pydantic validation, with its YAML line and a close match."""
    errors = e.errors()
    # an unknown key explains a missing one beside it ("tsk" for "task"): name it first
    err = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = _without_tags(tuple(err["loc"]))
    where = f"{path}:{lines.line(loc) or '?'}"
    dotted = ".".join(str(x) for x in loc)
    if err["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1], data)
        hint = _closest(loc[-1], parent.model_fields) if parent is not None else ""
        owner = ".".join(str(x) for x in loc[:-1]) or "the file"
        return f"{where}: unknown key '{loc[-1]}' in {owner}{hint}"
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        return f"{where}: {dotted}: backend must be 'vllm' or 'openai'"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] in ("literal_error", "enum"):  # a misspelt choice (speculation: sufix): the closest valid one
        msg += _closest(err["input"], re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", "")))
    return f"{where}: {dotted}: {msg}"


def _without_tags(loc: tuple) -> tuple:
    """pydantic's error location without the union tags it inserts (engine backend, node kind)."""
    out: list = []
    i = 0
    while i < len(loc):
        out.append(loc[i])
        tagged = (len(out) == 2 and out[0] == "engines") or (len(out) == 3 and out[:2] == ["workflow", "nodes"]) \
            or (len(out) == 4 and out[:2] == ["workflow", "nodes"] and out[3] == "node")
        if tagged and i + 1 < len(loc) and loc[i + 1] in ("vllm", "openai", *NODE_KINDS):
            i += 1  # the tag
        i += 1
    return tuple(out)


def _model_at(loc: tuple, data: dict) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``loc`` (for close-key hints)."""
    model: Any = WorkflowFile
    value: Any = data
    i = 0
    while i < len(loc):
        field = model.model_fields.get(loc[i]) if model is not None else None
        if field is None:
            return None
        value = value.get(loc[i]) if isinstance(value, dict) else None
        model = _resolve(field.annotation, value)
        if isinstance(model, tuple):  # a name -> spec mapping: step over the name
            i += 1
            value = value.get(loc[i]) if isinstance(value, dict) and i < len(loc) else None
            model = _resolve(model[1], value)
        i += 1
    return model


def _resolve(annotation: Any, value: Any) -> Any:
    """The model class an annotation means for ``value``, ("dict", item type) for a
    mapping, or None."""
    import typing

    if typing.get_origin(annotation) is typing.Annotated:
        return _resolve(typing.get_args(annotation)[0], value)
    if typing.get_origin(annotation) is dict:
        return ("dict", typing.get_args(annotation)[1])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    options = [_resolve(a, value) for a in typing.get_args(annotation)]
    options = [o for o in options if isinstance(o, type) and issubclass(o, BaseModel)]
    if isinstance(value, dict) and "backend" in value:
        options = [o for o in options if value["backend"] in typing.get_args(o.model_fields["backend"].annotation)]
    elif isinstance(value, dict) and _node_kind(value) is not None:
        options = [o for o in options if _node_kind(value) in o.model_fields]
    return options[0] if len(options) == 1 else None


def references(text: Any) -> list[tuple[str, str]]:
    """The (node, field) pairs a value refers to: ${node.field}, ${inputs.name}, ${item} as ("item", "")."""
    if isinstance(text, dict):
        return [r for v in text.values() for r in references(v)]
    if isinstance(text, list):
        return [r for v in text for r in references(v)]
    if not isinstance(text, str):
        return []
    out = []
    for m in REF.finditer(text):
        out.append(("item", "") if m.group(3) else (m.group(1), m.group(2)))
    return out


def node_references(node: Node) -> list[tuple[str, str]]:
    """The references a node's fields make (a map's inner ${item} excluded)."""
    if isinstance(node, MapNode):
        return references(node.map) + [r for r in node_references(node.node) if r[0] != "item"]
    if isinstance(node, ReasonNode):
        return references(node.prompt)
    if isinstance(node, AgentNode):
        return references(node.task)
    return references(node.args)


def check_references(w: LoadedWorkflow) -> None:
    """Names between sections, allowed tool modules, and the graph: a DAG of known nodes."""
    import networkx as nx

    s = w.spec

    def known(kind: str, name: str | None, choices: dict, *where: Any) -> None:
        if name is not None and name not in choices:
            listed = ", ".join(choices) or "none"
            raise WorkflowError(f"{w.where(*where)}: unknown {kind} '{name}'{_closest(name, choices)} "
                                f"({kind}s in this file: {listed})")

    for name, r in s.reasoners.items():
        known("engine", r.target, s.engines, "reasoners", name, "target")
        known("engine", r.draft, s.engines, "reasoners", name, "draft")
    for name, t in s.tools.items():
        module = t.function.split(":")[0]
        if not any(module == m or module.startswith(m + ".") for m in s.allowed_modules):
            raise WorkflowError(
                f"{w.where('tools', name, 'function')}: tool '{name}' comes from module '{module}', which is not in "
                f"allowed_modules ({', '.join(s.allowed_modules) or 'none listed'}); list it there if you trust it")
    for name in s.mcp_servers:
        if name in s.tools:
            raise WorkflowError(f"{w.where('mcp_servers', name)}: '{name}' names both a tool and an MCP server; "
                                "rename one (an agent's tools list names either)")
    for name, a in s.agents.items():
        known("reasoner", a.reasoner, s.reasoners, "agents", name, "reasoner")
        for i, tool in enumerate(a.tools):
            known("tool", tool, {**s.tools, **s.mcp_servers}, "agents", name, "tools", i)  # or an MCP server
    if s.workflow is None:
        return
    g = s.workflow
    graph = nx.DiGraph()
    graph.add_nodes_from(g.nodes)
    for name, node in g.nodes.items():
        inner = node.node if isinstance(node, MapNode) else node
        if isinstance(inner, ReasonNode):
            known("reasoner", inner.reason, s.reasoners, "workflow", "nodes", name)
        elif isinstance(inner, AgentNode):
            known("agent", inner.agent, s.agents, "workflow", "nodes", name)
        else:
            known("tool", inner.tool, s.tools, "workflow", "nodes", name)
        for ref, field in node_references(node):
            _check_ref(w, ref, field, name, isinstance(node, MapNode), ("workflow", "nodes", name))
            if ref not in ("inputs", "item"):
                graph.add_edge(ref, name)
    for out, ref_text in g.outputs.items():
        refs = references(ref_text)
        if not refs:
            raise WorkflowError(f"{w.where('workflow', 'outputs', out)}: output '{out}' holds no ${{node.output}} "
                                "reference")
        for ref, field in refs:
            _check_ref(w, ref, field, f"output {out}", False, ("workflow", "outputs", out))
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return
    names = [a for a, _ in cycle] + [cycle[0][0]]
    raise WorkflowError(f"{w.where('workflow', 'nodes', cycle[0][1])}: the workflow has a cycle: "
                        f"{' -> '.join(names)}; a node cannot depend on its own output")


def _check_ref(w: LoadedWorkflow, ref: str, field: str, owner: str, in_map: bool, where: tuple) -> None:
    g = w.spec.workflow
    assert g is not None
    if ref == "item":
        if not in_map:
            raise WorkflowError(f"{w.where(*where)}: {owner}: ${{item}} is only defined inside a map node")
        return
    if ref == "inputs":
        if field not in g.inputs:
            raise WorkflowError(f"{w.where(*where)}: {owner} refers to ${{inputs.{field}}}, which is not declared "
                                f"under workflow.inputs{_closest(field, g.inputs)}")
        return
    if ref not in g.nodes:
        raise WorkflowError(f"{w.where(*where)}: {owner} refers to ${{{ref}.{field}}}, but there is no node "
                            f"'{ref}'{_closest(ref, g.nodes)}")
    if ref == owner:
        raise WorkflowError(f"{w.where(*where)}: node '{owner}' refers to its own output; a node cannot depend "
                            "on itself")
    if field not in NODE_FIELDS:
        raise WorkflowError(f"{w.where(*where)}: ${{{ref}.{field}}}: a node gives "
                            f"{', '.join('${' + ref + '.' + f + '}' for f in NODE_FIELDS)}"
                            f"{_closest(field, NODE_FIELDS)}")


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a workflow file (for editor completion)."""
    schema = WorkflowFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "stepspec workflow"
    return schema
