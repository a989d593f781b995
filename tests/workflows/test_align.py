"""`stepspec draft align`: contamination-free problems, the target's solutions, LoRA training
that resumes, and the merged model usable by name (a scripted target, a tiny random draft)."""

import json
import re

import pytest

from fake_engine import ScriptedEngine

pytest.importorskip("reasoning_gym", reason="generated problems need stepspec[router]")


def test_generated_training_problems_are_seeded_and_answered():
    from stepspec.workflows.eval.training_problems import generated_problems

    a, b = generated_problems(30, seed=3), generated_problems(30, seed=3)
    assert [p.question for p in a] == [p.question for p in b]
    assert [p.question for p in a] != [p.question for p in generated_problems(30, seed=4)]
    assert len({p.dataset for p in a}) >= 8  # drawn in turn from the generators
    assert all(p.reference.strip() and "final answer" not in p.question.lower().replace("state the final answer", "")
               for p in a)


def test_the_contamination_check_catches_gsm_symbolic_and_passes_the_default_generators():
    """gsm_symbolic's templates are GSM8K test problems: the check must flag them; the
    problems align trains on must have no question near any evaluation question."""
    import reasoning_gym

    from stepspec.workflows.eval.datasets import find_data_dir
    from stepspec.workflows.eval.training_problems import near_duplicates

    try:
        data_dir = find_data_dir(None)
    except Exception:
        pytest.skip("no ../shared/data on this machine")
    symbolic = [e["question"] for e in reasoning_gym.create_dataset("gsm_symbolic", size=20, seed=0)]
    flagged = {h.training for h in near_duplicates(symbolic, data_dir)}
    assert len(flagged) >= 16, f"only {len(flagged)} of 20 gsm_symbolic questions flagged"
    assert all(h.dataset == "gsm8k" for h in near_duplicates(symbolic, data_dir))


def test_align_problems_stage_keeps_no_near_duplicate(tmp_path):
    from stepspec.workflows.align import align
    from stepspec.workflows.align.settings import AlignFiles, AlignSettings
    from stepspec.workflows.eval.datasets import find_data_dir
    from stepspec.workflows.eval.training_problems import near_duplicates

    try:
        data_dir = find_data_dir(None)
    except Exception:
        pytest.skip("no ../shared/data on this machine")
    spec = AlignSettings(num_problems=300, seed=0)
    align(spec, tmp_path, command="test", until="problems")
    rows = [json.loads(line) for line in AlignFiles(tmp_path).problems.read_text().splitlines()]
    assert len(rows) == 300
    assert near_duplicates([r["question"] for r in rows], data_dir) == []
    info = json.loads((tmp_path / "problems.json").read_text())
    assert info["kept"] == 300 and info["near_duplicates_dropped"] >= 0


def _scripted_target():
    """Writes two steps and the right boxed answer for even ids of 'What is N?'-like problems:
    the answer is looked up from the problem text written by the test."""
    answers = {}

    def continuation(prompt: str) -> str:
        question = prompt.split("<|im_start|>user\n")[-1].split("<|im_end|>")[0] if "<|im_start|>" in prompt else prompt
        key = next((k for k in answers if k in question), None)
        if "First, read it." not in prompt:
            return "First, read it.\n\n"
        return f"So the answer is \\boxed{{{answers.get(key, 'x')}}}."

    return ScriptedEngine("target", continuation=continuation), answers


@pytest.mark.timeout(900)
def test_align_end_to_end_on_a_tiny_draft_resumes_and_is_usable_by_name(tmp_path, tiny_model_path, monkeypatch):
    pytest.importorskip("peft", reason="LoRA training needs peft (stepspec[models])")
    from stepspec.engine.models import local_models, resolve_model
    from stepspec.workflows.align import align
    from stepspec.workflows.align.settings import AlignError, AlignFiles, AlignSettings

    monkeypatch.setenv("STEPSPEC_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "work"
    spec = AlignSettings(draft=str(tiny_model_path), name="tiny-aligned", num_problems=12, seed=1,
                     generators=["chain-sum", "leg-counting"], held_out=0.25, epochs=2, batch_tokens=256,
                     max_length=1024, checkpoint_every=1, train_dtype="float32", learning_rate=5e-3)
    files = AlignFiles(work)
    align(spec, work, command="test", until="problems")
    problems = [json.loads(line) for line in files.problems.read_text().splitlines()]
    target, answers = _scripted_target()
    for i, p in enumerate(problems):  # the target is right on 9 of 12
        answers[p["question"]] = p["answer"] if i % 4 else "wrong"

    # solutions; a run cut after 5 (the last line torn) solves only the other 7 again
    done = align(spec, work, command="test", until="solutions", engines=(target, None))
    assert done["solutions"]["num_solved"] == 12 and done["solutions"]["num_correct"] == 9
    assert len(target.prompts) == 12 * 2  # two steps each
    lines = files.solutions.read_text().splitlines(keepends=True)
    files.solutions.write_text("".join(lines[:5]) + lines[5][:40])
    done = align(spec, work, command="test", until="solutions", engines=(target, None))
    assert len(target.prompts) == 24 + 7 * 2 and done["solutions"]["num_correct"] == 9

    # a different setting is refused, naming it
    with pytest.raises(ValueError, match=r"seed: 1 there, 2 now"):
        align(spec.model_copy(update={"seed": 2}), work, command="test", until="problems")

    # training, interrupted after its second optimizer step, resumes from the checkpoint
    import importlib

    train_module = importlib.import_module("stepspec.workflows.align.train")

    real_save = train_module._save_checkpoint
    calls = []

    def save_then_stop(files_, model, optimizer, scheduler, step, history):
        real_save(files_, model, optimizer, scheduler, step, history)
        calls.append(step)
        if step == 2 and len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "_save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        align(spec, work, command="test", until="train", engines=(target, None))
    state_steps = calls[:]
    out = align(spec, work, command="stepspec draft align --test", until="merge", engines=(target, None))
    assert state_steps == [1, 2] and calls[2] == 3  # continued from step 2
    ev = out["evaluation"]
    assert ev["train_solutions"] + ev["held_out_solutions"] == 9 and ev["skipped_too_long"] == 0
    assert ev["after"]["loss"] < ev["before"]["loss"]  # it learned the target's solutions
    assert ev["after"]["agreement"] >= ev["before"]["agreement"]

    # the merged model: in the cache, found by name, with its card
    assert "tiny-aligned" in local_models()
    path = resolve_model("tiny-aligned")
    card = (tmp_path / "cache" / "tiny-aligned" / "README.md").read_text()
    assert path == out["model"] and "stepspec draft align --test" in card
    assert re.search(r"\| after \| [0-9.]+ \| [0-9.]+ \|", card)

    # another alignment under the same name is refused before its first stage (it would replace
    # this model, as aligning the bundled pair again would replace the default draft); the same
    # folder's run again is not
    with pytest.raises(AlignError, match=r"already holds 'tiny-aligned' .*--name tiny-aligned-2"):
        align(spec, tmp_path / "other", command="test", until="merge", engines=(target, None))
    assert not (tmp_path / "other" / "problems.jsonl").exists()
    assert align(spec, work, command="test", until="merge", engines=(target, None))["model"] == path


def test_draft_align_help_documents_the_stages_and_a_bad_setting_is_one_clear_error(tmp_path):
    import os
    import subprocess
    import sys

    cli = [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "draft", "align"]
    env = {**os.environ, "COLUMNS": "200"}
    r = subprocess.run(cli + ["--help"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0
    for stage in ("1 problems", "2 solutions", "3 train", "4 merge", "--until", "--export", "--lora-rank"):
        assert stage in r.stdout, stage
    r = subprocess.run(cli + ["--generators", "gsm-symbolic", "--output-dir", str(tmp_path / "a")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "unknown generator(s) ['gsm-symbolic']" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "a").exists()


def test_draft_align_aligns_the_bundled_drafts_base_by_default():
    """The default draft is the aligned one; `stepspec draft align` aligns what it came from (the
    bundled pair, as its committed run did), not the aligned draft again."""
    from stepspec.engine.models import BUNDLED_DRAFT, PRESETS
    from stepspec.workflows.align.settings import AlignSettings

    assert AlignSettings().draft == PRESETS[BUNDLED_DRAFT].base == "qwen2.5-coder-0.5b" != BUNDLED_DRAFT
    assert AlignSettings(draft="my/draft").draft == "my/draft"


def test_an_adapter_preset_is_checked_merged_into_its_base_and_listed(tmp_path, tiny_model_path, monkeypatch):
    """What `make setup` does for the aligned draft: the committed adapter's sha256 is checked,
    then it is merged into its base; a changed adapter file is refused, naming the fix."""
    import dataclasses

    torch = pytest.importorskip("torch")
    pytest.importorskip("peft", reason="adapter presets need peft (stepspec[models])")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from stepspec.engine import models

    monkeypatch.setenv("STEPSPEC_CACHE_DIR", str(tmp_path / "cache"))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    lora = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    for name, p in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # a merge that changes the weights
    adapter = tmp_path / "adapter"
    lora.save_pretrained(adapter)
    (adapter / "README.md").write_text("# tiny-aligned\na card\n")
    sha = models.file_sha256(adapter / "adapter_model.safetensors")
    preset = models.AdapterPreset("tiny-aligned", "a tiny draft, aligned", base=str(tiny_model_path), sha256=sha,
                                  role="draft", folder_override=adapter)
    monkeypatch.setitem(models.PRESETS, "tiny-aligned", preset)
    assert not models.is_prepared("tiny-aligned")
    path = models.prepare("tiny-aligned")
    assert models.is_prepared("tiny-aligned") and (path / "README.md").read_text().startswith("# tiny-aligned")
    merged = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged.state_dict()[q], AutoModelForCausalLM.from_pretrained(
        tiny_model_path, dtype=torch.float32).state_dict()[q])
    assert models.resolve_model("tiny-aligned") == str(path)

    monkeypatch.setitem(models.PRESETS, "tiny-aligned", dataclasses.replace(preset, sha256="0" * 64))
    with pytest.raises(models.ModelError, match="expected 0000.*reinstall stepspec"):
        models.prepare("tiny-aligned")
