"""Workflows and the agent on the bundled pair through real vLLM (minutes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models import BUNDLED_DRAFT, BUNDLED_TARGET, is_prepared
from workflows.eval.datasets import load_problems
from workflows.eval.graders import get_grader

pytestmark = [pytest.mark.vllm, pytest.mark.pair]

EXAMPLES = Path(__file__).resolve().parents[2] / "workflows" / "examples"


@pytest.fixture(scope="module", autouse=True)
def prepared():
    for name in (BUNDLED_TARGET, BUNDLED_DRAFT):
        if not is_prepared(name):
            pytest.fail(f"bundled model '{name}' is not prepared: run `stepspec models prepare` (make test does)")


def test_gsm8k_example_runs_from_the_command_line(tmp_path):
    question = "A baker makes 12 muffins a day for 5 days and sells 41 of them. How many are left?"
    record = tmp_path / "record.json"
    r = subprocess.run([sys.executable, "-c", "from workflows.cli.app import main; main()", "run",
                        str(EXAMPLES / "gsm8k_specreason.yaml"), "--input", f"question={question}",
                        "--output", str(record)], capture_output=True, text=True, timeout=1200,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-3000:]
    saved = json.loads(record.read_text())
    solve = saved["nodes"]["solve"]
    assert saved["status"] == "complete" and solve["status"] == "done"
    stats = solve["details"]["stats"]
    # SpecReason ran: the draft proposed steps and the target's judge ruled on each of them
    assert 0 <= stats["num_accepted_steps"] <= stats["num_drafted_steps"] and stats["num_drafted_steps"] >= 1
    assert stats["num_judge_calls"] >= stats["num_drafted_steps"]
    # the trace stopped on its answer, and the workflow's output is that answer (not the
    # whole text the runner falls back to without one). Whether the answer is right (19) is
    # the pair's accuracy, which `make bench` measures over many problems, not this test.
    assert stats["stop_reason"] == "answer" and solve["answer"] and solve["answer"] in solve["text"]
    assert saved["outputs"]["answer"] == solve["answer"] != solve["text"]


# GSM8K test problems short enough for a 384-token agent on two CPU cores
AGENT_PROBLEMS = (1, 3, 6)


def test_calculator_agent_answers_gsm8k_questions_on_the_bundled_pair(runner):
    """The calculator_agent example, in process: the agent's thoughts are SpecReason steps
    on the real pair, its calculator calls are parsed, run and fed back, and it answers."""
    from workflows.agents.agent import OBSERVATION
    from workflows.flows.runner import WorkflowRun
    from workflows.flows.spec import load_workflow

    problems = [load_problems("gsm8k")[i] for i in AGENT_PROBLEMS]
    grader = get_grader("gsm8k")
    run = WorkflowRun(load_workflow(EXAMPLES / "calculator_agent.yaml"))
    records = []
    try:
        for p in problems:
            records.append(runner.run(run.run({"question": p.question})))
    finally:
        runner.run(run.close())
    calls = []
    correct = 0
    for p, record in zip(problems, records):
        node = record["nodes"]["answer"]
        assert node["status"] == "done", node["error"]
        used = [c for c in node["details"]["tool_calls"] if c["used"]]
        calls += [(c, node["details"]["messages"]) for c in used]
        ok = node["answer"] is not None and grader.grade(f"\\boxed{{{node['answer']}}}", p.reference)["strict"].correct
        correct += ok
        print(f"\n#{p.index}: answer {node['answer']!r} (gold {grader.gold(p.reference)}), "
              f"{len(used)} calculator calls ({sum(c['speculative'] for c in used)} started from the draft), "
              f"{node['details']['iterations']} turns, {node['seconds']:.0f} s")
    assert calls
    # what the agent read back is what the calculator computes for the arguments it wrote,
    # and every used result was fed back to the agent as an observation
    calculator = run.tools["calculator"]
    for c, messages in calls:
        assert runner.run(calculator.call(c["args"])).observation == c["observation"]
        assert ["user", f"{OBSERVATION} {c['observation']}"] in messages
    assert any(c["ok"] for c, _ in calls)  # at least one call the agent wrote was read and computed
    assert correct >= 1
