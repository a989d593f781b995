"""The command line: presets, and bad input that must fail fast with a clear message."""

import json
import subprocess
import sys

import pytest

from workflows.datasets import DatasetError, load_problems


def stepspec(*args, env=None):
    return subprocess.run(
        [sys.executable, "-c", "from workflows.cli import main; main()", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )


def test_models_list_names_every_preset():
    r = stepspec("models", "list")
    assert r.returncode == 0, r.stderr
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "all-minilm-l6-v2"):
        assert name in r.stdout


def test_solve_with_an_unknown_model_fails_before_starting_anything():
    r = stepspec("solve", "1+1?", "--target", "qwen2.5-coder-1.5", "--spec", "none")
    assert r.returncode == 2
    assert "unknown model 'qwen2.5-coder-1.5'" in r.stderr and "Did you mean" in r.stderr
    assert "Traceback" not in r.stderr


def test_solve_with_an_unknown_speculation_method():
    r = stepspec("solve", "1+1?", "--spec", "medusa2")
    assert r.returncode == 2 and "unknown speculation method 'medusa2'" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--strategy", "spec-reason"], "unknown strategy 'spec-reason'. Did you mean 'specreason'"),
    (["--judge", "embeding"], "unknown judge 'embeding'. Did you mean 'embedding'"),
    (["--judge", "embedding"], "specreason cannot use judge 'embedding'"),
    (["--gamma", "3"], "strategy 'specreason' has no option gamma"),
    (["--strategy", "lookahead", "--threshold", "7"], "--threshold is an option of the score judge"),
    (["--strategy", "spec-thinking", "--judge", "score"], "strategy 'spec-thinking' takes no judge"),
    (["--judge-opt", "threshold"], "--judge-opt wants key=value"),
    (["--max-steps", "0"], "max_steps must be >= 1"),
])
def test_solve_rejects_bad_options_before_loading_models(args, message):
    r = stepspec("solve", "What is 2 + 3?", "--spec", "none", "--target", "/nonexistent-model", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr


def test_solve_an_empty_question():
    r = stepspec("solve", "  ", "--spec", "none")
    assert r.returncode == 2 and "question is empty" in r.stderr


def test_solve_with_an_out_of_range_index():
    r = stepspec("solve", "--index", "99999", "--spec", "none")
    assert r.returncode == 2 and "out of range" in r.stderr and "1319" in r.stderr


def test_gsm8k_loads_from_the_shared_data_folder():
    problems = load_problems("gsm8k")
    assert len(problems) == 1319
    assert problems[0].question.startswith("Janet")
    assert "####" in problems[0].reference
    aime = load_problems("aime24")
    assert len(aime) == 30 and "Please reason step by step" not in aime[0].question


def test_malformed_data_line_names_file_and_line(tmp_path):
    (tmp_path / "gsm8k_test.jsonl").write_text(
        json.dumps({"question": "q1", "answer": "#### 1"}) + "\n" + '{"question": "q2", "answer": \n'
    )
    with pytest.raises(DatasetError) as e:
        load_problems("gsm8k", tmp_path)
    assert "gsm8k_test.jsonl:2: malformed line" in str(e.value)
    (tmp_path / "gsm8k_test.jsonl").write_text(json.dumps({"q": "x"}) + "\n")
    with pytest.raises(DatasetError, match="expected a JSON object with fields 'question' and 'answer'"):
        load_problems("gsm8k", tmp_path)


def test_missing_data_folder_says_how_to_point_at_one(tmp_path):
    with pytest.raises(DatasetError, match="--data-dir"):
        load_problems("gsm8k", tmp_path / "nowhere")


@pytest.mark.vllm
def test_solve_streams_a_specreason_trace_on_real_vllm(tmp_path_factory):
    from orchestrator.trace import Trace
    from tiny_models import build_tiny_model

    target, draft = (build_tiny_model(tmp_path_factory.mktemp(f"cli{seed}"), seed=seed, weight_std=0.5,
                                      tie_word_embeddings=False) for seed in (0, 1))
    out = tmp_path_factory.mktemp("trace") / "trace.json"
    r = subprocess.run(
        [sys.executable, "-c", "from workflows.cli import main; main()", "solve", "How many eggs are left?",
         "--strategy", "specreason", "--target", str(target), "--draft", str(draft), "--spec", "none",
         "--delimiter", "ge", "--max-step-tokens", "8", "--max-tokens", "40", "--max-steps", "5",
         "--kv-cache-gib", "0.25", "--max-model-len", "512", "--trace-out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    trace = Trace.from_json(out.read_text())
    assert trace.strategy == "specreason" and trace.num_drafted_steps == len(trace.steps) > 0
    # every step was streamed as it joined the trace, marked by who wrote it
    marks = r.stdout.count("✓ draft") + r.stdout.count("→ target")
    assert marks == len(trace.steps)
    assert r.stdout.count("→ target") == len(trace.steps) - trace.num_accepted_steps
    assert "stop reason" in r.stdout and trace.stop_reason in r.stdout
