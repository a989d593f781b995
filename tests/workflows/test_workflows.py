"""YAML workflow files: the examples validate, broken files give their specific error
with the line, nothing in a file runs code, and the graph runs (on scripted engines)."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_engine import ScriptedEngine
from stepspec.workflows.flows.runner import WorkflowRun, check_workflow
from stepspec.workflows.flows.schema import WorkflowError, json_schema, load_workflow

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "stepspec" / "workflows" / "examples").glob("*.yaml"))
CLI = [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()"]
ENV = {**os.environ, "COLUMNS": "300"}

GOOD = """\
engines:
  target: {backend: vllm, model: qwen2.5-coder-1.5b}
  draft: {backend: vllm, model: qwen2.5-coder-0.5b}
reasoners:
  solver: {target: target, draft: draft, strategy: specreason}
allowed_modules: [stepspec.workflows.examples.tools]
tools:
  calculator: {function: "stepspec.workflows.examples.tools:calculator"}
agents:
  calc: {reasoner: solver, tools: [calculator]}
workflow:
  inputs: {question: {type: string}}
  nodes:
    plan: {reason: solver, prompt: "Plan: ${inputs.question}"}
    solve: {reason: solver, prompt: "${plan.output} ${inputs.question}"}
    check: {agent: calc, task: "Check ${solve.output}"}
  outputs: {answer: "${check.output}"}
"""


def test_every_example_validates():
    assert len(EXAMPLES) >= 5
    for path in EXAMPLES:
        w = load_workflow(path)
        assert w.spec.workflow is not None and w.spec.workflow.outputs, path


def test_examples_validate_from_the_command_line():
    for path in EXAMPLES:
        r = subprocess.run(CLI + ["validate", str(path)], capture_output=True, text=True, timeout=120, env=ENV)
        assert r.returncode == 0 and "valid" in r.stdout, (path, r.stderr)


BROKEN = [
    ("syntax error", ("solver: {target: target,", "solver: {target: [target,"), 5, "YAML syntax error"),
    ("unknown key", ("strategy: specreason", "stratgy: specreason"), 5,
     "unknown key 'stratgy' in reasoners.solver; did you mean 'strategy'?"),
    ("unknown engine", ("draft: draft, strategy", "draft: drafty, strategy"), 5,
     "unknown engine 'drafty'; did you mean 'draft'?"),
    ("cycle", ('prompt: "Plan: ${inputs.question}"', 'prompt: "Plan: ${check.output}"'), None,
     "the workflow has a cycle: "),
    ("tool outside the allowed modules", ('"stepspec.workflows.examples.tools:calculator"', '"os:system"'), 8,
     "module 'os', which is not in allowed_modules"),
    ("literal API key", ("draft: {backend: vllm, model: qwen2.5-coder-0.5b}",
                         "draft: {backend: openai, base_url: 'http://127.0.0.1:8000/v1', model: m, api_key: sk-abc}"),
     3, "a literal api_key does not belong in a workflow file"),
    ("dangling reference", ("Check ${solve.output}", "Check ${slove.output}"), 16,
     "there is no node 'slove'; did you mean 'solve'?"),
    ("unknown reasoner", ("agents:\n  calc: {reasoner: solver", "agents:\n  calc: {reasoner: solvr"), 10,
     "unknown reasoner 'solvr'; did you mean 'solver'?"),
    ("unknown tool", ("tools: [calculator]", "tools: [calculater]"), 10,
     "unknown tool 'calculater'; did you mean 'calculator'?"),
    ("node of no kind", ("check: {agent: calc,", "check: {agnt: calc,"), 16,
     "a node holds exactly one of reason:, agent:, tool:, map:"),
    ("undeclared input", ('"Plan: ${inputs.question}"', '"Plan: ${inputs.qestion}"'), 14,
     "${inputs.qestion}, which is not declared under workflow.inputs; did you mean 'question'?"),
    ("bad backend", ("backend: vllm, model: qwen2.5-coder-0.5b", "backend: sglang, model: x"), 3,
     "backend must be 'vllm' or 'openai'"),
    ("wrong type", ("{backend: vllm, model: qwen2.5-coder-1.5b}",
                    "{backend: vllm, model: qwen2.5-coder-1.5b, kv_cache_gib: lots}"), 2,
     "kv_cache_gib: Input should be a valid number"),
]


@pytest.mark.parametrize("case, edit, line, message", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_files_give_their_specific_error_with_the_line(tmp_path, case, edit, line, message):
    old, new = edit
    assert old in GOOD
    path = tmp_path / "wf.yaml"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(WorkflowError) as e:
        load_workflow(path)
    assert message in str(e.value)
    assert str(e.value).startswith(f"{path}:{line if line else ''}")


def test_cycle_names_its_nodes_and_line(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(GOOD.replace('prompt: "Plan: ${inputs.question}"', 'prompt: "Plan: ${check.output}"'))
    with pytest.raises(WorkflowError, match=r"wf.yaml:1[456]: the workflow has a cycle: (plan|solve|check) -> "):
        load_workflow(path)


def test_loading_never_runs_code_from_the_file(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f"engines: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(WorkflowError, match="evil.yaml:1: YAML syntax error: could not determine a constructor"):
        load_workflow(path)
    assert not marker.exists()
    # a tool module outside allowed_modules is never imported, even when it exists
    path.write_text(GOOD.replace('"stepspec.workflows.examples.tools:calculator"', '"tests.evil_tool:run"'))
    with pytest.raises(WorkflowError, match="not in allowed_modules"):
        load_workflow(path)
    assert "tests.evil_tool" not in sys.modules


def test_schema_is_json_schema_with_every_section(tmp_path):
    schema = json_schema()
    assert {"engines", "reasoners", "tools", "agents", "workflow", "allowed_modules"} <= set(schema["properties"])
    r = subprocess.run(CLI + ["schema", "--out", str(tmp_path / "s.json")], capture_output=True, text=True,
                       timeout=120, env=ENV)
    assert r.returncode == 0 and json.loads((tmp_path / "s.json").read_text())["title"] == "stepspec workflow"


def test_validate_cli_names_the_line_and_exits_2(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(GOOD.replace("draft: draft, strategy", "draft: drafty, strategy"))
    r = subprocess.run(CLI + ["validate", str(path)], capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 2 and f"{path}:5: unknown engine 'drafty'" in r.stderr and "Traceback" not in r.stderr
    path.write_text(GOOD.replace("model: qwen2.5-coder-0.5b", "model: qwen-nonexistent"))
    r = subprocess.run(CLI + ["validate", str(path)], capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 2 and f"{path}:3: engine 'draft'" in r.stderr



# -- duplicate keys and names resolved at validate time ------------------------------------------

def specreason_workflow(judge_lines: str) -> str:
    """A one-node workflow over the bundled pair whose reasoner is specreason with ``judge_lines``."""
    return f"""\
engines:
  target: {{backend: vllm, model: qwen2.5-coder-1.5b}}
  draft: {{backend: vllm, model: qwen2.5-coder-0.5b}}
reasoners:
  solver:
    target: target
    draft: draft
    strategy: specreason
{judge_lines}
workflow:
  inputs: {{question: {{type: string}}}}
  nodes:
    solve: {{reason: solver, prompt: "${{inputs.question}}"}}
  outputs: {{answer: "${{solve.output}}"}}
"""


BLOCK = specreason_workflow("""\
    judge: score
    judge_options:
      threshold: 6""")


def _error(tmp_path, text: str) -> str:
    """The message `stepspec validate` gives for a workflow file's text."""
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    with pytest.raises(WorkflowError) as e:
        check_workflow(load_workflow(path), check_env=False)
    return str(e.value)


DUPLICATES = [
    # (case, text, line of the first, line of the second, key)
    ("top level", BLOCK + "reasoners:\n  other: {target: target, strategy: target-only}\n", 4, 17, "reasoners"),
    ("nested", BLOCK.replace("      threshold: 6\n", "      threshold: 6\n      threshold: 8\n"), 11, 12, "threshold"),
    ("in a flow mapping", BLOCK.replace("{type: string}", "{type: string, type: list}"), 13, 13, "type"),
    ("deep in the graph", BLOCK.replace('    solve: {reason: solver, prompt: "${inputs.question}"}\n',
                                        '    solve: {reason: solver, prompt: "${inputs.question}"}\n'
                                        '    solve: {reason: solver, prompt: "again"}\n'), 15, 16, "solve"),
]


@pytest.mark.parametrize("case, text, first, second, key", DUPLICATES, ids=[d[0] for d in DUPLICATES])
def test_a_key_given_twice_names_both_lines_and_the_fix(tmp_path, case, text, first, second, key):
    path = tmp_path / "wf.yaml"
    message = _error(tmp_path, text)
    assert message.startswith(f"{path}:{second}: duplicate key '{key}'")
    assert f"given at {path}:{first} and again at {path}:{second}" in message
    assert "keep only the last value" in message and "Keep one of them" in message


def test_a_merge_key_may_still_be_overridden(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(BLOCK.replace("  target: {backend: vllm, model: qwen2.5-coder-1.5b}\n",
                                  "  target: &base {backend: vllm, model: qwen2.5-coder-1.5b}\n")
                         .replace("  draft: {backend: vllm, model: qwen2.5-coder-0.5b}\n",
                                  "  draft: {<<: *base, model: qwen2.5-coder-0.5b}\n"))
    w = load_workflow(path)
    assert w.spec.engines["draft"].model == "qwen2.5-coder-0.5b" and w.spec.engines["draft"].backend == "vllm"


NAMES = [
    # (case, (old, new), line, what the message says)
    ("misspelt strategy", ("strategy: specreason", "strategy: specreasn"), 8,
     ["reasoner 'solver': unknown strategy 'specreasn'", "did you mean 'specreason'?", "Strategies: target-only"]),
    ("unknown judge", ("judge: score", "judge: scor"), 9, ["unknown judge 'scor'", "did you mean 'score'?"]),
    ("unknown judge option", ("      threshold: 6\n", "      threshold: 6\n      top_p: 3\n"), 12,
     ["judge 'score' has no option 'top_p'", "did you mean 'top_k'?",
      "Its options: threshold, method, rubric, step_delimiter, top_k"]),
    ("misspelt judge option", ("threshold: 6", "treshold: 6"), 11,
     ["judge 'score' has no option 'treshold'", "did you mean 'threshold'?"]),
    ("unknown strategy option", ("    strategy: specreason\n", "    strategy: lookahead\n    options: {gama: 3}\n"), 9,
     ["strategy 'lookahead' has no option 'gama'", "did you mean 'gamma'?", "Its options: backoff, backoff_tokens, gamma, "]),
    ("a judge where the strategy takes none", ("strategy: specreason", "strategy: draft-only"), 9,
     ["strategy 'draft-only' takes no judge"]),
    ("misspelt router", ("    strategy: specreason\n    judge: score\n    judge_options:\n      threshold: 6\n",
                         "    strategy: arbitrage\n    router: treshold\n"), 9,
     ["unknown router 'treshold'", "did you mean 'threshold'?"]),
    ("unknown router option", ("    strategy: specreason\n    judge: score\n    judge_options:\n      threshold: 6\n",
                               "    strategy: arbitrage\n    router: threshold\n    router_options: {tau: 1}\n"), 9,
     ["router 'threshold' has no option 'tau'", "Its options: min_confidence, statistic"]),
    ("misspelt token-level method", ("qwen2.5-coder-1.5b}", "qwen2.5-coder-1.5b, speculation: sufix}"), 2,
     ["speculation: Input should be 'none', 'ngram', 'suffix' or 'draft'", "did you mean 'suffix'?"]),
    ("unknown model preset", ("model: qwen2.5-coder-0.5b", "model: qwen2.5-coder-0.6b"), 3,
     ["engine 'draft': unknown model 'qwen2.5-coder-0.6b'", "did you mean 'qwen2.5-coder-0.5b'?"]),
    ("unknown token drafter", ("qwen2.5-coder-1.5b}", "qwen2.5-coder-1.5b, speculative_config: {model: qwen-0.5b}}"),
     2, ["engine 'target': unknown model 'qwen-0.5b'"]),
    ("unknown engine", ("    draft: draft\n", "    draft: drat\n"), 7,
     ["unknown engine 'drat'; did you mean 'draft'?"]),
    ("misspelt tool function",
     ("workflow:\n", ("allowed_modules: [stepspec.workflows.examples.tools]\ntools:\n"
                      "  calc: {function: 'stepspec.workflows.examples.tools:calculater'}\nworkflow:\n")), 14,
     ["module 'stepspec.workflows.examples.tools' has no 'calculater'", "did you mean 'stepspec.workflows.examples.tools:calculator'?"]),
]


@pytest.mark.parametrize("case, edit, line, says", NAMES, ids=[n[0] for n in NAMES])
def test_validate_resolves_every_name_with_its_line_and_the_closest_one(tmp_path, case, edit, line, says):
    old, new = edit
    assert old in BLOCK
    message = _error(tmp_path, BLOCK.replace(old, new, 1))
    assert message.startswith(f"{tmp_path / 'wf.yaml'}:{line}: "), message
    for part in says:
        assert part.lower() in message.lower(), (part, message)


def test_the_block_workflow_is_valid(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(BLOCK)
    assert check_workflow(load_workflow(path), check_env=False) == []


def test_validate_command_rejects_a_duplicate_key_and_a_misspelt_strategy(tmp_path):
    from typer.testing import CliRunner

    from stepspec.workflows.cli.app import app

    path = tmp_path / "wf.yaml"
    path.write_text(BLOCK)
    ok = CliRunner().invoke(app, ["validate", str(path)])
    assert ok.exit_code == 0 and f"{path}:valid" in "".join(ok.output.split()), ok.output  # wrapped anywhere
    for text, where, says in [
        (BLOCK.replace("      threshold: 6\n", "      threshold: 6\n      threshold: 8\n"), f"{path}:12",
         f"duplicate key 'threshold': it is given at {path}:11 and again at {path}:12"),
        (BLOCK.replace("strategy: specreason", "strategy: specreasn"), f"{path}:8", "did you mean 'specreason'?"),
    ]:
        path.write_text(text)
        r = CliRunner().invoke(app, ["validate", str(path)])
        assert r.exit_code != 0 and isinstance(r.exception, WorkflowError), (r.exit_code, r.output)
        assert str(r.exception).startswith(f"{where}: ") and says.lower() in str(r.exception).lower()
        assert "valid (" not in r.output


def test_run_command_checks_names_before_preparing_any_model(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(BLOCK.replace("strategy: specreason", "strategy: specreasn"))
    cache = tmp_path / "empty-cache"  # no model is prepared here: preparing one would show (and take minutes)
    env = {**ENV, "STEPSPEC_CACHE_DIR": str(cache)}
    r = subprocess.run(CLI + ["run", str(path), "--input", "question=hi"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2 and f"{path}:8: reasoner 'solver': unknown strategy 'specreasn'" in r.stderr, r.stderr
    assert "preparing" not in r.stderr and not (cache.exists() and any(cache.iterdir()))


# -- running graphs on scripted engines ------------------------------------------------------


RUNNABLE = """\
engines:
  target: {backend: vllm, model: qwen2.5-coder-1.5b}
reasoners:
  solver: {target: target, strategy: target-only}
allowed_modules: [stepspec.workflows.examples.tools, test_workflows]
tools:
  calculator: {function: "stepspec.workflows.examples.tools:calculator"}
  split: {function: "test_workflows:split_words"}
  boom: {function: "test_workflows:explode"}
agents:
  calc: {reasoner: solver, tools: [calculator]}
workflow:
  inputs:
    question: {type: string}
    items: {type: list, default: ["2 + 2", "3 * 3"]}
  nodes:
    a: {reason: solver, prompt: "A: ${inputs.question}"}
    b: {reason: solver, prompt: "B: ${inputs.question}"}
    both: {reason: solver, prompt: "Combine ${a.output} and ${b.output}"}
    each: {map: "${inputs.items}", node: {tool: calculator, args: {expression: "${item}"}}}
    words: {tool: split, args: {text: "${both.text}"}}
    bad: {tool: boom, args: {x: 1}}
    after_bad: {reason: solver, prompt: "never ${bad.output}"}
  outputs:
    answer: "${both.output}"
    squares: "${each.output}"
    broken: "${after_bad.output}"
"""


def split_words(text: str) -> list:
    return text.split()


def explode(x: int) -> int:
    raise RuntimeError("tool exploded")


class Overlap(ScriptedEngine):
    """Answers "\\boxed{N}" with N from the prompt; records how many calls overlap."""

    def __init__(self):
        super().__init__(continuation=self.answer)
        self.in_flight = self.most = 0

    def answer(self, prompt):
        last = prompt.split("<|user|>")[-1]
        if last.startswith("A:"):
            return "\\boxed{1}"
        if last.startswith("B:"):
            return "\\boxed{2}"
        return "one and two make \\boxed{3}"

    async def generate(self, requests):
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.05)
        self.in_flight -= 1
        return await super().generate(requests)


def test_graph_runs_independent_nodes_together_and_keeps_outputs_past_a_failure(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(RUNNABLE)
    engine = Overlap()
    run = WorkflowRun(load_workflow(path), engines={"target": engine})
    record = asyncio.run(run.run({"question": "what?"}, record_path=tmp_path / "record.json"))
    nodes = record["nodes"]
    assert engine.most >= 2  # a and b ran at the same time
    assert nodes["a"]["output"] == "1" and nodes["b"]["output"] == "2" and nodes["both"]["output"] == "3"
    assert nodes["each"]["output"] == [4, 9] and nodes["words"]["output"] == ["one", "and", "two", "make", "\\boxed{3}"]
    assert nodes["bad"]["status"] == "failed" and "tool exploded" in nodes["bad"]["error"]
    assert nodes["after_bad"]["status"] == "skipped" and "depends on bad" in nodes["after_bad"]["error"]
    assert record["status"] == "failed" and record["outputs"] == {"answer": "3", "squares": [4, 9], "broken": None}
    saved = json.loads((tmp_path / "record.json").read_text())
    assert saved["nodes"]["both"]["output"] == "3" and saved["status"] == "failed"


def test_inputs_are_checked_before_anything_runs(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(RUNNABLE)
    run = WorkflowRun(load_workflow(path), engines={"target": Overlap()})
    with pytest.raises(WorkflowError, match="input 'question' is required"):
        asyncio.run(run.run({}))
    with pytest.raises(WorkflowError, match="unknown input qestion"):
        asyncio.run(run.run({"qestion": "x"}))
    with pytest.raises(WorkflowError, match="input 'items' should be a list"):
        asyncio.run(run.run({"question": "x", "items": "not json"}))


def test_agent_node_uses_its_tool(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(RUNNABLE.replace('    a: {reason: solver, prompt: "A: ${inputs.question}"}',
                                     '    a: {agent: calc, task: "A: ${inputs.question}"}'))

    def continuation(prompt):
        if "Observation:" in prompt.split("<|user|>")[-1]:
            return "\\boxed{42}"
        return 'Action: calculator({"expression": "6 * 7"})\n\n' if "A:" in prompt else "\\boxed{2}"

    run = WorkflowRun(load_workflow(path), engines={"target": ScriptedEngine(continuation=continuation)})
    record = asyncio.run(run.run({"question": "six sevens?"}))
    a = record["nodes"]["a"]
    assert a["output"] == "42" and a["details"]["tool_calls"][0]["observation"] == "42"


def test_run_cli_fails_before_loading_models_on_a_missing_input(tmp_path):
    r = subprocess.run(CLI + ["run", str(EXAMPLES[0])], capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 2 and "is required" in r.stderr, r.stderr


def test_the_readme_workflow_validates(tmp_path):
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Workflows, agents and tools"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    (tmp_path / "readme.yaml").write_text(block)
    w = load_workflow(tmp_path / "readme.yaml")
    assert set(w.spec.workflow.nodes) == {"plan", "answer"}


LIKELIHOOD_YAML = specreason_workflow("""\
    judge: likelihood
    judge_options: {JUDGE_OPTIONS}""")


def test_a_workflow_names_the_likelihood_judge_and_its_options(tmp_path):
    from stepspec.judges.likelihood import LikelihoodJudge
    from stepspec.workflows.flows.runner import WorkflowError

    engines = {"target": ScriptedEngine("target"), "draft": ScriptedEngine("draft")}
    path = tmp_path / "lik.yaml"
    path.write_text(LIKELIHOOD_YAML.replace("JUDGE_OPTIONS", "floor: -3.5, max_rank: 2"))
    judge = WorkflowRun(load_workflow(path), engines=engines).reasoners["solver"].judge
    assert isinstance(judge, LikelihoodJudge) and judge.floor == -3.5 and judge.max_rank == 2
    assert judge.math_max_rank == 1  # the default stays
    path.write_text(LIKELIHOOD_YAML.replace("JUDGE_OPTIONS", "flor: -3.5"))
    with pytest.raises(WorkflowError, match="reasoner 'solver': judge 'likelihood' has no option 'flor'. Did you mean "
                                            "'floor'"):
        WorkflowRun(load_workflow(path), engines=engines)
