"""The command line: presets, and bad input that must fail fast with a clear message."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepspec.engine.models import BUNDLED_DRAFT
from stepspec.workflows.eval.datasets import DatasetError, load_problems


def stepspec(*args, env=None):
    return subprocess.run(
        [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", *args],
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
    (["--gamma", "3"], "strategy 'specreason' has no option 'gamma'"),
    (["--strategy", "lookahead", "--threshold", "7"], "--threshold is an option of the score judge"),
    (["--strategy", "spec-thinking", "--judge", "score"], "strategy 'spec-thinking' takes no judge"),
    (["--judge-opt", "threshold"], "--judge-opt wants key=value"),
    (["--max-steps", "0"], "solve: max_steps must be an integer >= 1, got 0"),
    (["--target-accept", '{"max_rank": 2'], "--target-accept wants JSON"),
    (["--target-accept", '{"max_rank": 2}'], "target_accept judges the target's token-level proposals, and the "
                                             "target has none"),
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
    from stepspec.orchestrator.trace import Trace
    from tiny_models import build_tiny_model

    target, draft = (build_tiny_model(tmp_path_factory.mktemp(f"cli{seed}"), seed=seed, weight_std=0.5,
                                      tie_word_embeddings=False) for seed in (0, 1))
    out = tmp_path_factory.mktemp("trace") / "trace.json"
    log_dir = tmp_path_factory.mktemp("logs")
    r = subprocess.run(
        [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "solve", "How many eggs are left?",
         "--strategy", "specreason", "--first-target-steps", "0", "--target", str(target), "--draft", str(draft), "--spec", "none",
         "--delimiter", "ge", "--max-step-tokens", "8", "--max-tokens", "40", "--max-steps", "5",
         "--kv-cache-gib", "0.25", "--max-model-len", "512", "--trace-out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "STEPSPEC_LOG_DIR": str(log_dir)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # quiet: the terminal shows stepspec's lines only; vLLM's (all processes) are in the run log
    assert r.stderr == "", r.stderr[-3000:]
    assert "target engine" in r.stdout and "draft engine" in r.stdout and "ready" in r.stdout
    assert not any(noise in r.stdout for noise in ("INFO", "WARNING", "Loading safetensors", "Triton")), r.stdout
    (log_file,) = log_dir.glob("engine-*.log")
    assert "Initializing a V1 LLM engine" in log_file.read_text()
    trace = Trace.from_json(out.read_text())
    assert trace.strategy == "specreason" and trace.num_drafted_steps == len(trace.steps) > 0
    # every step was streamed as it joined the trace, marked by who wrote it
    marks = r.stdout.count("✓ draft") + r.stdout.count("→ target")
    assert marks == len(trace.steps)
    assert r.stdout.count("→ target") == len(trace.steps) - trace.num_accepted_steps
    assert "stop reason" in r.stdout and trace.stop_reason in r.stdout


def test_a_cut_steps_mark_stays_on_one_line_in_a_narrow_terminal(monkeypatch):
    """The CI failure this guards: rich wrapped a long cut line between '→' and 'target'."""
    from rich.console import Console

    from stepspec.orchestrator.trace import StepRecord
    from stepspec.workflows.cli import solve as cli

    narrow = Console(width=40, force_terminal=False, color_system=None, record=True)
    monkeypatch.setattr(cli, "console", narrow)
    cut = {"offset": 3, "token": " alternatively", "target_logprob": -6.25, "draft_logprob": -0.4, "rank": 120,
           "rule": "floor", "target_token_id": 7, "kept_text": "She ate"}
    cli.print_step(StepRecord(index=0, author="target", text="She ate 3 eggs.", draft_text="She ate alternatively",
                               accepted=False, judge="likelihood", num_kept_tokens=3, cut=cut))
    cli.print_step(StepRecord(index=1, author="draft", text="16 - 3 = 13", accepted=True, score=9.0))
    lines = narrow.export_text().splitlines()
    assert "→ target" in lines[0] and lines[0].startswith("[ 0] ✂ draft cut at token 3 ' alternatively'")
    assert sum("✓ draft" in line for line in lines) == 1


def test_a_cut_step_reads_once_with_the_rejected_draft_marked_where_it_was_thrown_away(monkeypatch):
    """The kept drafted words show once, then the rejected rest inside its mark, then the
    target's words; a step a step-level judge rejected shows its draft marked, then the
    target's step; an accepted draft and a target step show as they are."""
    from rich.console import Console

    from stepspec.orchestrator.trace import StepRecord
    from stepspec.workflows.cli import solve as cli

    plain = Console(width=200, force_terminal=False, color_system=None, record=True)
    monkeypatch.setattr(cli, "console", plain)
    cut = {"offset": 3, "token": " alternatively", "target_logprob": -6.25, "draft_logprob": -0.4, "rank": 120,
           "rule": "floor", "target_token_id": 7, "kept_text": "1. She ate"}
    cli.print_step(StepRecord(index=0, author="target", text="1. She ate 3 eggs.",
                               draft_text="1. She ate alternatively 2 eggs.", accepted=False, judge="likelihood",
                               num_kept_tokens=3, cut=cut))
    cli.print_step(StepRecord(index=1, author="target", text="16 - 3 = 13", draft_text="16 + 3 = 19",
                               accepted=False, judge="score", score=2.0))
    cli.print_step(StepRecord(index=2, author="draft", text="13 * 2 = 26", accepted=True, score=9.0))
    cli.print_step(StepRecord(index=3, author="target", text="\\boxed{26}"))
    lines = plain.export_text().splitlines()
    assert lines[1] == "1. She ate⟨rejected:  alternatively 2 eggs.⟩ 3 eggs."
    assert lines[3] == "⟨rejected: 16 + 3 = 19⟩16 - 3 = 13"
    assert lines[5] == "13 * 2 = 26" and lines[7] == "\\boxed{26}"
    assert sum("She ate" in line for line in lines) == 1 and len(lines) == 8


def test_bench_opt_values_none_and_null_switch_an_option_off():
    from stepspec.workflows.cli.bench import strategy_options

    opts = strategy_options(["sr"], None, None, None, None,
                             ["sr.strategy=specreason", "sr.judge=likelihood", "sr.judge.floor=none",
                              "sr.judge.math_max_rank=null", "sr.judge.contrast=None", "sr.judge.max_rank=1",
                              "sr.judge.tolerance=2", "sr.backoff=false"])
    assert opts == {"sr": {"strategy": "specreason", "judge": "likelihood", "backoff": False,
                           "judge_options": {"floor": None, "math_max_rank": None, "contrast": None, "max_rank": 1,
                                             "tolerance": 2}}}


RUNS = Path(__file__).resolve().parents[2] / "benchmarks" / "runs"


def _config_runs(tmp_path, *names):
    """`stepspec bench --config benchmarks/runs/NAME.yaml` into a fresh folder, per name."""
    return {n: ["--config", str(RUNS / f"{n}.yaml"), "--output-dir", str(tmp_path / n)] for n in names}


def test_each_bench_config_file_is_its_committed_runs_settings(tmp_path):
    """Every file in benchmarks/runs/ loads, checks, and holds the settings its committed run
    (output_dir) was started with, so `make bench-config CONFIG=FILE` resumes that run. The two
    frontier choice files say why they do not: their run predates an option their arms now need."""
    from stepspec.workflows.cli.bench import _started_from
    from stepspec.workflows.eval.bench import load_bench_config

    files = sorted(RUNS.glob("*.yaml"))
    assert len(files) >= 10
    for path in files:
        spec, output_dir = load_bench_config(path)
        assert output_dir and output_dir.startswith("benchmarks/measured/"), path
        root = RUNS.parents[1]
        if path.stem in ("frontier_aligned", "frontier_unaligned"):
            assert "predates draft_opening" in path.read_text()
            with pytest.raises(ValueError, match="other settings than .* \\(strategy_options\\)"):
                _started_from(spec, str(root / output_dir), str(path))
        else:
            assert _started_from(spec, str(root / output_dir), str(path)) == str(root / output_dir), path


def test_bench_config_errors_name_the_file_and_the_fix(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("dataset: gsm8k\nlimt: 3\n")
    r = stepspec("bench", "--config", str(bad), "--no-progress")
    # the message names the file, however the terminal wraps its long path
    assert r.returncode == 2 and "limt" in r.stderr and str(bad) in "".join(r.stderr.split()), r.stderr
    bad.write_text("dataset: gsm8k\ndataset: aime24\n")
    r = stepspec("bench", "--config", str(bad), "--no-progress")
    assert r.returncode == 2 and "duplicate key 'dataset'" in r.stderr, r.stderr
    good = tmp_path / "good.yaml"
    good.write_text("limit: 2\nstrategies: [target-only]\n")
    r = stepspec("bench", "--config", str(good), "--limit", "3", "--no-progress")
    message = " ".join(r.stderr.split())
    assert r.returncode == 2 and "holds the run's settings; --limit would change it" in message, r.stderr
    r = stepspec("bench", "--config", str(good), "--mode", "latency", "--output-dir", str(tmp_path / "new"),
                 "--no-progress")
    assert r.returncode == 2 and "holds no run yet" in " ".join(r.stderr.split()), r.stderr
    r = stepspec("bench", "--config", str(tmp_path / "none.yaml"), "--no-progress")
    assert r.returncode == 2 and "no such bench config file" in r.stderr


def _bench_config(args, monkeypatch):
    """The run's spec and each arm's checked reasoner, as `stepspec bench ARGS` would save them."""
    from typer.testing import CliRunner

    import stepspec.workflows.eval.bench_run as bench
    from stepspec.workflows.cli.app import app

    built = {}

    async def no_run(spec, run_dir, **kwargs):  # what the command hands over to the run
        built.update(spec=spec, run_dir=run_dir)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_bench", no_run)
    r = CliRunner().invoke(app, ["bench", *args, "--no-progress"])
    assert r.exit_code == 130, r.output  # the stand-in's Ctrl-C
    spec = built["spec"]
    assert str(built["run_dir"]) == args[args.index("--output-dir") + 1]
    checked = spec.check()  # each arm's reasoner, checked on stand-in engines
    arms = {a: bench.arm_info(spec, a, checked[a]) for a in spec.strategies}
    return spec.model_dump(mode="json"), checked, {a: (arms[a].strategy, arms[a].judge) for a in arms}


def test_the_speed_config_is_the_default_against_target_only_and_the_ceiling_at_default_engine_settings(
        tmp_path, monkeypatch):
    """`make bench` (benchmarks/runs/speed.yaml) up to the engines: the default specreason beside target-only and draft-only
    (the pair's ceiling), each at its fastest (one generation, no call per step), in both modes, every
    engine setting at its default (the default draft); under load also target-only on specreason's
    target (suffix decoding)."""
    from stepspec.engine.config import EnginePair

    (args,) = _config_runs(tmp_path, "speed").values()
    config, checked, arms = _bench_config(args, monkeypatch)
    assert arms == {"target-only": ("target-only", None), "specreason": ("specreason", "likelihood"),
                    "draft-only": ("draft-only", None), "to-suffix": ("target-only", None)}
    assert config["strategy_options"] == {"target-only": {"run_tokens": 640}, "draft-only": {"run_tokens": 640},
                                          "to-suffix": {"strategy": "target-only", "target_spec": "suffix",
                                                        "run_tokens": 640}}
    assert config["draft"] == BUNDLED_DRAFT  # the default draft
    assert config["modes"] == ["throughput", "latency"] and config["latency_limit"] == 30
    assert config["limit"] == 100 and config["throughput_wave"] == 25
    assert config["latency_strategies"] == ["target-only", "specreason", "draft-only"]
    pair = EnginePair()
    assert {k: config[k] for k in ("target_spec", "draft_spec", "target_dtype", "draft_dtype")} == {
        "target_spec": pair.target_spec, "draft_spec": pair.draft_spec, "target_dtype": "auto", "draft_dtype": "auto"}
    assert checked["specreason"].options == {}  # the strategy's defaults


def test_the_aligned_config_runs_specreason_with_each_draft_on_three_engines(tmp_path, monkeypatch):
    """benchmarks/runs/aligned.yaml up to the engines: specreason with the unaligned draft (named: the
    default is the aligned one now) and the aligned draft, the governor off in both, against
    target-only, every target on suffix decoding, so the run needs three engines (one target, two
    drafts)."""
    import stepspec.workflows.eval.bench as bench

    (args,) = _config_runs(tmp_path, "aligned").values()
    config, checked, arms = _bench_config(args, monkeypatch)
    assert arms == {"target-only": ("target-only", None), "specreason": ("specreason", "likelihood"),
                    "sr-aligned": ("specreason", "likelihood")}
    assert checked["specreason"].options == checked["sr-aligned"].options == {"backoff": False}
    spec = bench.BenchSettings.model_validate(config)
    engines, roles = spec.arm_engines()
    assert sorted(engines) == ["draft (qwen2.5-coder-0.5b)", "draft (qwen2.5-coder-0.5b-aligned)", "target"]
    assert {c.speculation for role, c in engines.items() if role == "target"} == {"suffix"}
    assert roles["sr-aligned"] == ("target", "draft (qwen2.5-coder-0.5b-aligned)")
    assert roles["specreason"] == ("target", "draft (qwen2.5-coder-0.5b)")


@pytest.mark.parametrize("target, problems", [("frontier", (100, 30, 15)),
                                             ("frontier_report", (0, 100, 25))])
def test_the_frontier_configs_sweep_the_targets_opening_with_each_draft_on_two_engines(
        target, problems, tmp_path, monkeypatch):
    """benchmarks/runs/frontier_*.yaml (chosen on GSM8K 100-129) and frontier_report_*.yaml (reported
    on 0-99) up to the engines: one run per draft, specreason with the target writing its first
    0, 1 and 2 steps (the governor off, and the opening sentence not drafted, which would make
    k=1 the same as k=0) beside target-only, under load in waves."""
    import stepspec.workflows.eval.bench as bench

    runs = _config_runs(tmp_path, f"{target}_aligned", f"{target}_unaligned")
    for file, args in runs.items():
        name = file.rsplit("_", 1)[1]
        config, checked, arms = _bench_config(args, monkeypatch)
        assert (config["offset"], config["limit"], config["throughput_wave"]) == problems
        assert config["modes"] == ["throughput"]
        assert [checked[f"sr-f{k}"].options for k in range(3)] == [
            {"first_target_steps": k, "draft_opening": False, "backoff": False} for k in range(3)]
        engines, _ = bench.BenchSettings.model_validate(config).arm_engines()
        draft = "qwen2.5-coder-0.5b-aligned" if name == "aligned" else "qwen2.5-coder-0.5b"
        assert sorted(engines) == ["draft", "target"] and engines["draft"].model.endswith(draft)


def test_the_verify_configs_are_valid_and_saved_as_given(tmp_path, monkeypatch):
    """benchmarks/runs/verify.yaml and verify_plan.yaml, up to the engines: every arm builds its reasoner,
    and each run's config holds the arms, modes and limits."""
    runs = _config_runs(tmp_path, "verify", "verify_plan")
    runs = {"main": runs["verify"], "plan": runs["verify_plan"]}
    for config in (_bench_config(args, monkeypatch)[0] for args in runs.values()):
        assert set(config["modes"]) == {"throughput", "latency"} and config["latency_limit"] == 30
        assert config["limit"] == 100 and config["max_num_seqs"] == 100 and config["kv_cache_gib"] == 1.5
        assert config["max_tokens"] == 640 and config["target_spec"] == "suffix"
        assert config["target_dtype"] == config["draft_dtype"] == "float32"  # as the committed runs ran

    config, checked, arms = _bench_config(runs["main"], monkeypatch)
    exact = checked["sr-lik-exact"].judge
    assert (exact.floor, exact.max_rank, exact.math_max_rank) == (None, 1, None)
    loose = checked["sr-lik-loose"].judge
    assert (loose.floor, loose.max_rank, loose.math_max_rank) == (-8, None, None)
    typed = checked["sr-lik-typed"].judge
    assert (typed.floor, typed.math_max_rank) == (-5.0, 1)
    assert config["strategies"] == ["target-only", "sr-score", "sr-lik-typed", "sr-lik-exact", "sr-lik-loose"]
    assert config["latency_strategies"] == ["target-only", "sr-score", "sr-lik-typed"]
    options = config["strategy_options"]
    assert options["sr-lik-exact"]["judge_options"] == {"max_rank": 1, "floor": None, "math_max_rank": None}
    assert options["sr-lik-loose"]["judge_options"] == {"floor": -8, "math_max_rank": None}
    # the first run's specreason arms let the draft write from the first step
    assert {a: checked[a].options.get("first_target_steps") for a in config["strategies"][1:]} == dict.fromkeys(
        config["strategies"][1:], 0)
    assert arms == {"target-only": ("target-only", None), "sr-score": ("specreason", "score"),
                    "sr-lik-exact": ("specreason", "likelihood"), "sr-lik-typed": ("specreason", "likelihood"),
                    "sr-lik-loose": ("specreason", "likelihood")}

    config, checked, arms = _bench_config(runs["plan"], monkeypatch)
    assert config["strategies"] == ["target-only", "sr-lik-plan", "la-lik"]
    assert config["latency_strategies"] == ["target-only", "sr-lik-plan"]
    plan = checked["sr-lik-plan"]
    assert plan.options["first_target_steps"] == 2 and (plan.judge.floor, plan.judge.math_max_rank) == (-5.0, 1)
    assert arms == {"target-only": ("target-only", None), "sr-lik-plan": ("specreason", "likelihood"),
                    "la-lik": ("lookahead", "likelihood")}


def test_bench_resume_takes_mode_and_refuses_flags_that_would_change_the_run(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import stepspec.workflows.eval.bench_run as bench
    from stepspec.workflows.cli.app import app

    handed = []

    async def no_run(spec, run_dir, **kwargs):
        handed.append(kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_bench", no_run)
    for extra, modes in (([], None), (["--mode", "latency"], ("latency",)), (["--mode", "both"],
                                                                          ("throughput", "latency"))):
        r = CliRunner().invoke(app, ["bench", "--resume", str(tmp_path / "run"), *extra, "--no-progress"])
        assert r.exit_code == 130, r.output
        assert handed[-1]["resume"] and handed[-1]["modes"] == modes
    # the saved config is the run's: --limit or --opt on a resume is an error, not ignored
    r = stepspec("bench", "--resume", str(tmp_path / "run"), "--limit", "5", "--opt", "tree.k=2", "--no-progress")
    message = " ".join(r.stderr.split())
    assert r.returncode == 2 and "--limit, --opt would change it" in message, r.stderr
    assert "start a new run in another --output-dir" in message


def test_bench_with_a_model_that_does_not_resolve_leaves_no_run_behind(tmp_path):
    # `make bench` resumes any directory holding a run: a failed start must not leave one
    r = stepspec("bench", "--target", "/nonexistent-model", "--spec", "none", "--limit", "2", "--mode", "both",
                 "--output-dir", str(tmp_path / "r"), "--no-progress")
    assert r.returncode == 2 and "unknown model '/nonexistent-model'" in " ".join(r.stderr.split()), r.stderr
    assert not (tmp_path / "r").exists()


def test_the_tree_config_runs_the_search_strategies_on_the_verifier_against_their_twins(tmp_path, monkeypatch):
    (args,) = _config_runs(tmp_path, "tree").values()
    config, checked, arms = _bench_config(args, monkeypatch)
    assert config["limit"] == 100 and config["latency_limit"] == 30 and config["modes"] == ["throughput", "latency"]
    assert config["throughput_wave"] == 10  # resumable wave by wave, each wave timed for all arms in one session
    assert arms == {s: (s, "likelihood") for s in ("tree", "tree-target", "best-of-n", "best-of-n-target")}
    assert all((checked[s].options["k"], checked[s].options["beam"]) == (3, 2) for s in ("tree", "tree-target"))
    assert all((checked[s].options["n"], checked[s].options["temperature"]) == (5, 0.7)
               for s in ("best-of-n", "best-of-n-target"))


def test_the_router_config_runs_the_committed_router_beside_the_verifier_curve(tmp_path, monkeypatch):
    """benchmarks/runs/router.yaml up to the engines: the committed router file loads under this
    feature version, and specreason runs on the verifier at two strictnesses beside it."""
    pytest.importorskip("torch", reason="the router file needs torch")
    (args,) = _config_runs(tmp_path, "router").values()
    config, checked, arms = _bench_config(args, monkeypatch)
    assert config["limit"] == 100 and config["latency_limit"] == 30 and config["modes"] == ["throughput", "latency"]
    assert arms == {"target-only": ("target-only", None), "arbitrage": ("arbitrage", None),
                    "sr-lik": ("specreason", "likelihood"), "sr-lik-loose": ("specreason", "likelihood")}
    assert config["latency_strategies"] == ["target-only", "arbitrage", "sr-lik"]
    router = checked["arbitrage"].router
    assert router.name == "learned" and router.metadata["label"] == "verifier" and 0 < router.tau < 1
    from stepspec.orchestrator.specreason import SpecReasonOptions

    # both let the target write the first two steps (specreason by its default)
    assert checked["arbitrage"].options["first_target_steps"] == SpecReasonOptions().first_target_steps == 2
    assert "first_target_steps" not in checked["sr-lik"].options
    loose = checked["sr-lik-loose"].judge
    assert (loose.floor, loose.math_max_rank) == (-8, None) and checked["sr-lik"].judge.floor == -5.0


def test_the_router_generated_config_runs_the_retrained_router_beside_the_committed_one(tmp_path, monkeypatch):
    """benchmarks/runs/router_generated.yaml up to the engines: the router retrained on generated problems
    and the committed one (trained on gsm_symbolic) each drive an arbitrage arm, the same way
    (the target writes the first two steps, the governor off), beside target-only, under load."""
    pytest.importorskip("torch", reason="the router file needs torch")
    (args,) = _config_runs(tmp_path, "router_generated").values()
    config, checked, arms = _bench_config(args, monkeypatch)
    assert (config["limit"], config["throughput_wave"], config["modes"]) == (100, 25, ["throughput"])
    assert arms == {"target-only": ("target-only", None), "arbitrage": ("arbitrage", None),
                    "arb-generated": ("arbitrage", None)}
    old, new = checked["arbitrage"], checked["arb-generated"]
    assert old.options == new.options == {"first_target_steps": 2, "backoff": False}
    import stepspec.workflows.eval.bench as bench

    engines, _ = bench.BenchSettings.model_validate(config).arm_engines()  # two fit this machine, three do not
    assert sorted(engines) == ["draft", "target"] and engines["target"].speculation == "suffix"
    assert old.router.metadata["label"] == new.router.metadata["label"] == "verifier"
    assert old.router.metadata != new.router.metadata  # two routers, not one file twice
