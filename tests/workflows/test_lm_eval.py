"""stepspec as an lm-evaluation-harness model: a local GSM8K task, --limit 3."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fake_engine import ScriptedEngine

lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is in stepspec[eval]")

from scripted import ROOT, TASKS, local_task


def test_registering_stepspec_leaves_lm_evals_own_models_loadable():
    """lm-eval imports its models only while its registry is empty; ours must not empty-mask them."""
    code = ("import stepspec.workflows.eval.lm_eval_model\n"
            "from lm_eval.api.registry import get_model\n"
            "print(get_model('stepspec').__name__, get_model('local-chat-completions').__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["StepspecLM", "LocalChatCompletion"]


def test_the_harness_scores_a_specreason_reasoner(tmp_path):
    from lm_eval.tasks import TaskManager

    from stepspec.orchestrator.reasoner import Reasoner
    from stepspec.workflows.eval.lm_eval_model import StepspecLM, cut_at

    rows = [{"question": f"What is {i} + 10?", "answer": f"{i} + 10 = {i + 10}\n#### {i + 10}"} for i in range(4)]
    data = tmp_path / "gsm8k_test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def number(prompt):
        return int(prompt.split("What is ")[-1].split(" +")[0])

    # draft: right on even questions; the target's judge rejects its wrong answers and the target fixes them
    target = ScriptedEngine(
        "target",  # the rest of its solution: a step per call, all of it in one generation
        continuation=lambda p: ("" if "Add ten." in p else "Add ten.\n\n") + "\\boxed{%d}" % (number(p) + 10),
        next_token=lambda p: [("9", 0.0)] if "\\boxed{%d}" % (number(p) + 10) in p or "\\boxed" not in p else [("0", 0.0)])
    draft = ScriptedEngine(
        "draft", continuation=lambda p: "Add ten.\n\n" if "Add ten." not in p else "\\boxed{%d}" % (number(p) + 10 + number(p) % 2))
    lm = StepspecLM(reasoner=Reasoner(target, draft, strategy="specreason", judge="score", first_target_steps=0))
    try:
        out = lm_eval.simple_evaluate(model=lm, tasks=["gsm8k_stepspec_tmp"], limit=3, log_samples=True,
                                      task_manager=TaskManager(include_path=str(local_task(tmp_path, data))))
    finally:
        lm.close()
    res = out["results"]["gsm8k_stepspec_tmp"]
    assert res["exact_match,boxed"] == 1.0 and res["exact_match,flexible-extract"] == 1.0
    samples = [s for s in out["samples"]["gsm8k_stepspec_tmp"] if s["filter"] == "boxed"]
    assert [s["doc_id"] for s in samples] == [0, 1, 2]
    assert samples[1]["resps"][0][0] == "Add ten.\n\n\\boxed{11}"  # the draft's 12 rejected, the target's 11 kept
    assert cut_at("a\n\nQuestion: b", ["Question:", "</s>"]) == "a\n\n"
    with pytest.raises(NotImplementedError, match="generation tasks"):
        lm.loglikelihood([])


@pytest.mark.vllm
def test_lm_eval_command_runs_stepspec_on_real_vllm(tmp_path_factory):
    from tiny_models import build_tiny_model

    target, draft = (build_tiny_model(tmp_path_factory.mktemp(f"lm{seed}"), seed=seed, weight_std=0.5,
                                      tie_word_embeddings=False) for seed in (0, 1))
    out = tmp_path_factory.mktemp("lm-eval-out")
    r = subprocess.run(
        [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "lm-eval", "--model", "stepspec",
         "--model_args", f"strategy=specreason,target={target},draft={draft},delimiter=ge,max_tokens=24,"
                         "max_step_tokens=8,max_steps=3,kv_cache_gib=0.25,max_model_len=512",
         "--tasks", "gsm8k_stepspec", "--include_path", str(TASKS), "--limit", "3",
         "--output_path", str(out), "--log_samples"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (results,) = out.rglob("results_*.json")
    scored = json.loads(results.read_text())["results"]["gsm8k_stepspec"]
    assert "exact_match,boxed" in scored and "exact_match,flexible-extract" in scored
    (samples,) = out.rglob("samples_gsm8k_stepspec_*.jsonl")
    rows = [json.loads(x) for x in samples.read_text().splitlines()]
    rows = [x for x in rows if x["filter"] == "boxed"]
    assert len(rows) == 3 and all(x["resps"][0][0] for x in rows)  # a trace for each question


def test_model_args_reach_nested_settings_by_dotted_keys():
    """The harness splits model_args at commas, so a mapping (judge options, the target's token rule)
    comes as dotted keys."""
    from stepspec.workflows.eval.lm_eval_model import reasoner_config

    config = reasoner_config({"strategy": "specreason", "spec": "draft", "judge_options.floor": -3.0,
                              "judge_options.math_target": True, "target_accept.max_rank": 2,
                              "target_accept.floor": -2.0})
    assert config.judge_options == {"floor": -3.0, "math_target": True}
    assert config.target.accept.max_rank == 2 and config.target.accept.floor == -2.0
    with pytest.raises(ValueError, match="'judge_options.floor' sets a key inside 'judge_options'"):
        reasoner_config({"judge_options": 1, "judge_options.floor": -3.0})
    with pytest.raises(ValueError, match="'judge_options' gives a value to a setting that dotted keys also set"):
        reasoner_config({"judge_options.floor": -3.0, "judge_options": 1})
    with pytest.raises(ValueError, match="judge_options='floor' is not a mapping; give each option as a dotted key"):
        reasoner_config({"judge_options": "floor"})
