"""The run configuration is declared once: every entry point builds the same ReasonerConfig
for the same settings, with the same defaults, and checks it before any model is prepared."""

import os
import subprocess
import sys
import time

import pytest
import typer
from typer.testing import CliRunner

from stepspec.engine.config import EnginePair, OpenAIEngineConfig, VLLMEngineConfig
from stepspec.engine.models import BUNDLED_DRAFT, BUNDLED_TARGET, ModelError
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.config import ReasonerConfig, RunSettings
from stepspec.orchestrator.reasoner import Reasoner
from stepspec.workflows.cli.app import app
from stepspec.workflows.eval.bench import BenchSettings
from stepspec.workflows.flows.runner import WorkflowRun
from stepspec.workflows.flows.schema import ReasonerEntry, load_workflow
from stepspec.workflows.routing.collect import CollectSettings

URL = "http://127.0.0.1:8000/v1"


class Captured(Exception):
    """Raised by the stand-in for Reasoner.from_config: the entry point got this far, no further."""

    def __init__(self, config):
        super().__init__("captured")
        self.config = config


@pytest.fixture
def capture(monkeypatch):
    """Reasoner.from_config replaced: it records the config it is given and stops there."""

    def from_config(cls, config, **kwargs):
        raise Captured(config)

    monkeypatch.setattr(Reasoner, "from_config", classmethod(from_config))

    def run(entry, *args, **kwargs):
        with pytest.raises(Captured) as caught:
            entry(*args, **kwargs)
        return caught.value.config

    return run


def cli(*args):
    """`stepspec solve ARGS` up to building the reasoner."""
    r = CliRunner().invoke(app, ["solve", "What is 2 + 3?", "--json", *args])
    if isinstance(r.exception, Captured):
        raise r.exception
    raise AssertionError(f"solve did not reach Reasoner.from_config: {r.output} {r.exception!r}")


def yaml_reasoner(tmp_path, engines: str, reasoner: str):
    """A workflow file's reasoner, as `stepspec run` builds it (engines stand in: none loads)."""
    path = tmp_path / "wf.yaml"
    path.write_text(f"engines:\n{engines}reasoners:\n  solver: {reasoner}\n")
    w = load_workflow(path)
    WorkflowRun(w, engines={name: object() for name in w.spec.engines})


def lm_eval_model(arg_string: str):
    """lm-eval's model from its --model_args string, as the harness makes it."""
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness is in stepspec[eval]")
    from stepspec.workflows.eval.lm_eval_model import StepspecLM

    StepspecLM.create_from_arg_string(arg_string, {"batch_size": None, "max_batch_size": None, "device": None})


def test_every_entry_point_builds_the_same_config_by_default(capture, tmp_path):
    configs = {
        "cli": capture(cli),
        "python from_models": capture(Reasoner.from_models),
        "python config": ReasonerConfig(),
        "yaml": capture(yaml_reasoner, tmp_path,
                        f"  t: {{backend: vllm, model: {BUNDLED_TARGET}, speculation: suffix}}\n"
                        f"  d: {{backend: vllm, model: {BUNDLED_DRAFT}, speculation: suffix}}\n", "{target: t, draft: d}"),
        "lm-eval": capture(lm_eval_model, ""),
    }
    # specreason (the default strategy): its target mostly verifies, suffix decoding is its own method
    expected = ReasonerConfig(target=VLLMEngineConfig(model=BUNDLED_TARGET, speculation="suffix"),
                              draft=VLLMEngineConfig(model=BUNDLED_DRAFT, speculation="suffix"))
    assert {name: c for name, c in configs.items() if c != expected} == {}
    # target-only: the target writes everything, fastest with the draft model drafting its tokens
    alone = {"cli": capture(cli, "--strategy", "target-only"),
             "python from_models": capture(Reasoner.from_models, strategy="target-only"),
             "python config": ReasonerConfig(strategy="target-only"),
             "lm-eval": capture(lm_eval_model, "strategy=target-only")}
    expected = ReasonerConfig(
        strategy="target-only", target=VLLMEngineConfig(model=BUNDLED_TARGET, speculation="draft",
                                                        draft_model=BUNDLED_DRAFT),
        draft=VLLMEngineConfig(model=BUNDLED_DRAFT, speculation="suffix"))
    assert {name: c for name, c in alone.items() if c != expected} == {}


def test_every_entry_point_builds_the_same_config_for_the_same_settings(capture, tmp_path):
    """Non-default settings, all in-process: the draft drafts the target's tokens (4 at a time)."""
    configs = {
        "cli": capture(cli, "--strategy", "lookahead", "--gamma", "3", "--judge", "score", "--threshold", "6",
                       "--max-tokens", "512", "--max-steps", "20", "--timeout", "30", "--delimiter", "\\n",
                       "--num-speculative-tokens", "4", "--kv-cache-gib", "2", "--max-model-len", "2048"),
        "python from_models": capture(Reasoner.from_models, strategy="lookahead", gamma=3, judge="score",
                                      judge_options={"threshold": 6}, budget=Budget(max_tokens=512, max_steps=20,
                                                                                    timeout=30),
                                      delimiter="\n", num_speculative_tokens=4, kv_cache_gib=2, max_model_len=2048),
        "yaml": capture(yaml_reasoner, tmp_path,
                        f"  t: {{backend: vllm, model: {BUNDLED_TARGET}, speculation: draft, draft_model: "
                        f"{BUNDLED_DRAFT}, num_speculative_tokens: 4, kv_cache_gib: 2, max_model_len: 2048}}\n"
                        f"  d: {{backend: vllm, model: {BUNDLED_DRAFT}, speculation: suffix, num_speculative_tokens: 4, "
                        "kv_cache_gib: 2, max_model_len: 2048}\n",
                        '{target: t, draft: d, strategy: lookahead, options: {gamma: 3}, judge: score, '
                        'judge_options: {threshold: 6}, budget: {max_tokens: 512, max_steps: 20, timeout: 30}, '
                        'delimiter: "\\n"}'),
        "lm-eval": capture(lm_eval_model, "strategy=lookahead,gamma=3,judge=score,threshold=6,max_tokens=512,"
                                          "max_steps=20,timeout=30,delimiter=\\n,num_speculative_tokens=4,"
                                          "kv_cache_gib=2,max_model_len=2048"),
    }
    expected = ReasonerConfig(
        target=VLLMEngineConfig(model=BUNDLED_TARGET, speculation="draft", draft_model=BUNDLED_DRAFT,
                                num_speculative_tokens=4, kv_cache_gib=2, max_model_len=2048),
        draft=VLLMEngineConfig(model=BUNDLED_DRAFT, speculation="suffix", num_speculative_tokens=4, kv_cache_gib=2,
                               max_model_len=2048),
        strategy="lookahead", options={"gamma": 3}, judge="score", judge_options={"threshold": 6.0},
        budget=Budget(max_tokens=512, max_steps=20, max_seconds=30.0), delimiter="\n")
    assert {name: c for name, c in configs.items() if c != expected} == {}


def test_each_engines_dtype_is_taken_by_every_entry_point(capture, tmp_path):
    """--target-dtype/--draft-dtype, their keywords, YAML's dtype and lm-eval's model_args: one field."""
    configs = {
        "cli": capture(cli, "--target-dtype", "bfloat16", "--draft-dtype", "float32"),
        "python from_models": capture(Reasoner.from_models, target_dtype="bfloat16", draft_dtype="float32"),
        "yaml": capture(yaml_reasoner, tmp_path,
                        f"  t: {{backend: vllm, model: {BUNDLED_TARGET}, dtype: bfloat16, speculation: suffix}}\n"
                        f"  d: {{backend: vllm, model: {BUNDLED_DRAFT}, dtype: float32, speculation: suffix}}\n",
                        "{target: t, draft: d}"),
        "lm-eval": capture(lm_eval_model, "target_dtype=bfloat16,draft_dtype=float32"),
    }
    target, draft = EnginePair(target_dtype="bfloat16", draft_dtype="float32").engines("suffix")  # specreason's
    assert (target.dtype, draft.dtype) == ("bfloat16", "float32")
    expected = ReasonerConfig(target=target, draft=draft)
    assert {name: c for name, c in configs.items() if c != expected} == {}
    with pytest.raises(ValueError, match="target_dtype"):
        RunSettings(target_dtype="fp8")
    with pytest.raises(ValueError, match="computes in the dtype it was started with"):
        RunSettings(target_url=URL, target_dtype="bfloat16")


def test_every_entry_point_builds_the_same_config_for_an_openai_target(capture, tmp_path):
    """The target on an OpenAI-compatible server, the draft in-process with its own token method."""
    configs = {
        "cli": capture(cli, "--strategy", "lookahead", "--gamma", "3", "--target", "served-target",
                       "--target-url", URL, "--api-key-env", "STEPSPEC_TEST_KEY", "--draft-spec", "ngram",
                       "--num-speculative-tokens", "4", "--max-tokens", "512"),
        "python": ReasonerConfig(
            target=OpenAIEngineConfig(base_url=URL, model="served-target", api_key_env="STEPSPEC_TEST_KEY"),
            draft=VLLMEngineConfig(model=BUNDLED_DRAFT, speculation="ngram", num_speculative_tokens=4),
            strategy="lookahead", options={"gamma": 3}, budget=Budget(max_tokens=512)),
        "yaml": capture(yaml_reasoner, tmp_path,
                        f"  t: {{backend: openai, base_url: '{URL}', model: served-target, "
                        "api_key_env: STEPSPEC_TEST_KEY}\n"
                        f"  d: {{backend: vllm, model: {BUNDLED_DRAFT}, speculation: ngram, "
                        "num_speculative_tokens: 4}\n",
                        "{target: t, draft: d, strategy: lookahead, options: {gamma: 3}, budget: {max_tokens: 512}}"),
        "lm-eval": capture(lm_eval_model, f"strategy=lookahead,gamma=3,target=served-target,target_url={URL},"
                                          "api_key_env=STEPSPEC_TEST_KEY,draft_spec=ngram,num_speculative_tokens=4,"
                                          "max_tokens=512"),
    }
    first = configs.pop("cli")
    assert isinstance(first.target, OpenAIEngineConfig) and first.draft.speculation == "ngram"
    assert {name: c for name, c in configs.items() if c != first} == {}


def _cli_default(*path: str, name: str):
    command = typer.main.get_command(app)
    for part in path:
        command = command.commands[part]
    return next(p.default for p in command.params if p.name == name)


def test_the_defaults_agree_everywhere(capture, tmp_path):
    from stepspec.workflows.eval.lm_eval_model import reasoner_config as lm_eval_config

    commands = [("solve",), ("bench",), ("router", "collect")]
    # the one token budget
    max_tokens = {
        "Budget": Budget().max_tokens, "ReasonerConfig": ReasonerConfig().budget.max_tokens,
        "RunSettings": RunSettings().max_tokens, "BenchSettings": BenchSettings().max_tokens,
        "CollectSettings": CollectSettings().max_tokens, "YAML": ReasonerEntry(target="t").budget.max_tokens,
        "lm-eval": lm_eval_config({}).budget.max_tokens,
        "from_models": capture(Reasoner.from_models).budget.max_tokens,
        **{" ".join(c): _cli_default(*c, name="max_tokens") for c in commands},
    }
    assert set(max_tokens.values()) == {1024}, max_tokens
    # the one token-level method inside the target: auto, each strategy's own
    methods = {
        "EnginePair": EnginePair().target_spec, "BenchSettings": BenchSettings().target_spec,
        "CollectSettings": CollectSettings().target_spec, **{" ".join(c): _cli_default(*c, name="target_spec") for c in commands},
    }
    assert set(methods.values()) == {"auto"}, methods
    resolved = {
        "ReasonerConfig": ReasonerConfig(strategy="target-only").target.speculation,
        "lm-eval": lm_eval_config({"strategy": "target-only"}).target.speculation,
        "from_models": capture(Reasoner.from_models, strategy="target-only").target.speculation,
        "RunSettings": RunSettings().reasoner_config(strategy="target-only").target.speculation,
    }
    assert set(resolved.values()) == {"draft"}, resolved
    assert ReasonerConfig(strategy="target-only").target.draft_model == BUNDLED_DRAFT
    # each engine's dtype: auto, the fastest measured on the machine
    dtypes = {
        "EnginePair": (EnginePair().target_dtype, EnginePair().draft_dtype),
        "ReasonerConfig": (ReasonerConfig().target.dtype, ReasonerConfig().draft.dtype),
        "BenchSettings": (BenchSettings().target_dtype, BenchSettings().draft_dtype),
        "lm-eval": (lm_eval_config({}).target.dtype, lm_eval_config({}).draft.dtype),
        **{" ".join(c): (_cli_default(*c, name="target_dtype"), _cli_default(*c, name="draft_dtype"))
           for c in commands},
    }
    assert set(dtypes.values()) == {("auto", "auto")}, dtypes
    # without a draft model there is nothing to draft tokens with
    assert capture(Reasoner.from_models, draft=None, strategy="target-only").target.speculation is None


def test_bad_settings_fail_with_the_existing_errors_before_any_model(tmp_path):
    from stepspec.orchestrator.reasoner import check_reasoner

    with pytest.raises(ValueError, match="unknown speculation method 'medusa2'"):
        RunSettings(target_spec="medusa2")
    with pytest.raises(ValueError, match="max_steps\n  Input should be greater than or equal to 1"):
        RunSettings(max_steps=0)  # pydantic's own words; the front ends word it through stepspec.common.options.checked
    with pytest.raises(ValueError, match="runs inside an in-process vLLM engine"):
        RunSettings(target_url=URL, target_spec="suffix")
    with pytest.raises(ValueError, match="unknown judge 'scor'. Did you mean 'score'"):
        check_reasoner(ReasonerConfig(judge="scor"))
    with pytest.raises(ValueError, match="needs a draft engine"):
        check_reasoner(ReasonerConfig(draft=None))
    with pytest.raises(ModelError, match="unknown model 'qwen2.5-coder-1.5'.*Did you mean"):
        check_reasoner(ReasonerConfig(target=VLLMEngineConfig(model="qwen2.5-coder-1.5")))
    assert check_reasoner(ReasonerConfig(strategy="lookahead", options={"gamma": 3})).options["gamma"] == 3


def test_solve_with_a_dead_target_url_fails_fast_naming_it(tmp_path):
    cache = tmp_path / "empty-cache"  # nothing prepared here: preparing the in-process draft would show
    url = "http://127.0.0.1:1/v1"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "solve", "What is 2 + 3?",
                        "--target", "served-target", "--target-url", url],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "STEPSPEC_CACHE_DIR": str(cache)})
    seconds = time.perf_counter() - t0
    assert r.returncode == 2, r.stdout + r.stderr
    message = " ".join(r.stderr.split())
    assert "http://127.0.0.1:1" in message and "not answering" in message and "Traceback" not in r.stderr, message
    assert seconds < 60, seconds
    assert not (cache.exists() and any(cache.iterdir()))  # the draft was not prepared first


@pytest.mark.vllm
@pytest.mark.server
def test_solve_and_bench_run_on_an_openai_compatible_server(tiny_model_path, tmp_path):
    """`--target-url`: the target on a real vLLM server, through solve and bench; the bench
    says that the server's prefix cache could not be reset between solves."""
    import json

    from openai_server import free_port, vllm_server

    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    small = ["--target", "tiny", "--target-url", url, "--delimiter", "ge", "--max-step-tokens", "8",
             "--max-tokens", "24", "--max-steps", "3"]
    data = tmp_path / "add.jsonl"
    data.write_text("".join(json.dumps({"q": f"What is {i} + 1?", "a": str(i + 1)}) + "\n" for i in range(2)))
    cli_ = [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()"]
    with vllm_server(tiny_model_path, port, tmp_path / "server.log", max_model_len=256, kv_cache_gib=1 / 16):
        r = subprocess.run(cli_ + ["solve", "What is 2 + 3?", "--strategy", "target-only", "--json", *small],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        solved = json.loads(r.stdout)
        assert solved["trace"]["steps"] and solved["stats"]["num_tokens"] > 0
        run = tmp_path / "run"
        r = subprocess.run(cli_ + ["bench", "--strategies", "target-only", "--dataset", str(data), "--question-field",
                                   "q", "--answer-field", "a", "--grader", "numeric", "--output-dir", str(run),
                                   "--no-progress", *small], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (results_file,) = run.glob("results_*.json")
    results = json.loads(results_file.read_text())
    assert results["status"] == "complete" and results["config"]["target_url"] == url
    assert results["run"]["sessions"][-1]["prefix_cache_reset"] == {"target": False}
    report = (run / "report.md").read_text()
    assert f"target `tiny` served at {url}" in report and "could not reset its prefix cache" in report
