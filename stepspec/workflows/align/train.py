"""Stage 3 of an alignment: LoRA on the draft, trained on the target's own solutions.

Each example is the prompt every strategy sends (the chat template of the reasoning
messages) followed by the target's solution and the end-of-turn token; the loss is the
draft's cross-entropy on the solution tokens only. Since the solutions are the target's
greedy tokens, the draft's *agreement* with the target on a held-out solution is the share
of its tokens the draft's own argmax predicts: what token-level draft acceptance and
step-level acceptance both grow with. For example, a held-out solution of 100 tokens of
which the draft's argmax matches 71 has agreement 0.71.

Training is resumable: every ``checkpoint_every`` optimizer steps the adapter, the optimizer,
the schedule and the step are written to ``checkpoint/`` (a new folder renamed over the old,
so an interruption leaves the previous one), and a resumed run continues from the step after.
The held-out loss and agreement are measured before the first step and after the last
(``evaluation.json``), and the finished adapter is written to ``adapter/``.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import dataclass
from typing import Any

from stepspec.common.files import atomic_write_json
from stepspec.engine.dtype import cpu_info
from stepspec.engine.models import resolve_model
from stepspec.orchestrator.prompts import reasoning_messages
from stepspec.workflows.align.data import Progress, quiet, training_split
from stepspec.workflows.align.settings import AlignError, AlignFiles, AlignSettings


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    num_prompt: int  # the first num_prompt tokens are the prompt: no loss on them


def examples(tokenizer, records: list[dict], max_length: int) -> tuple[list[Example], int]:
    """(the records as examples, how many were longer than ``max_length`` and skipped)."""
    out, skipped = [], 0
    for r in records:
        prompt = tokenizer.apply_chat_template(reasoning_messages(r["question"]), add_generation_prompt=True,
                                               tokenize=False)
        head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        body = tokenizer(r["text"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        if len(head) + len(body) > max_length:
            skipped += 1
            continue
        out.append(Example(head + body, len(head)))
    return out, skipped


def train_dtype(requested: str):
    """The torch dtype training computes in (auto: bf16 on a GPU or a CPU with native bf16)."""
    import torch

    if requested not in ("auto", "bfloat16", "float32"):
        raise AlignError(f"train_dtype '{requested}': choose auto, bfloat16 or float32")
    if requested == "auto":
        native = torch.cuda.is_available() or bool(cpu_info()[1])
        return torch.bfloat16 if native else torch.float32
    return getattr(torch, requested)


def _loss_and_hits(model, ex: Example, device) -> tuple[Any, int, int]:
    """(mean loss over the solution's tokens, tokens the argmax predicts, solution tokens)."""
    import torch

    ids = torch.tensor([ex.input_ids], device=device)
    # logits only where they predict a solution token (positions num_prompt - 1 .. L - 2)
    keep = len(ex.input_ids) - ex.num_prompt + 1
    logits = model(input_ids=ids, logits_to_keep=keep).logits[0, :-1].float()
    labels = ids[0, ex.num_prompt:]
    loss = torch.nn.functional.cross_entropy(logits, labels)
    return loss, int((logits.argmax(-1) == labels).sum()), int(labels.numel())


def evaluate(model, held: list[Example], device) -> dict[str, float]:
    """Held-out loss (per solution token) and agreement with the target's greedy tokens."""
    import torch

    total_loss, hits, n = 0.0, 0, 0
    model.eval()
    with torch.no_grad():
        for ex in held:
            loss, h, k = _loss_and_hits(model, ex, device)
            total_loss += float(loss) * k
            hits, n = hits + h, n + k
    model.train()
    return {"loss": total_loss / n, "agreement": hits / n, "tokens": n}


def batches(train: list[Example], batch_tokens: int, seed: int, epoch: int) -> list[list[Example]]:
    """One epoch's optimizer steps: examples shuffled (seeded per epoch), packed up to ``batch_tokens``."""
    order = list(train)
    random.Random(seed * 1000 + epoch).shuffle(order)
    out, current, size = [], [], 0
    for ex in order:
        if current and size + len(ex.input_ids) > batch_tokens:
            out.append(current)
            current, size = [], 0
        current.append(ex)
        size += len(ex.input_ids)
    return out + ([current] if current else [])


def _save_checkpoint(files: AlignFiles, model, optimizer, scheduler, step: int, history: list) -> None:
    import torch

    tmp = files / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step,
                "history": history}, tmp / "state.pt")
    old = files / "checkpoint.old"
    shutil.rmtree(old, ignore_errors=True)
    if files.checkpoint.exists():
        files.checkpoint.rename(old)
    tmp.rename(files.checkpoint)
    shutil.rmtree(old, ignore_errors=True)


def train(spec: AlignSettings, files: AlignFiles, *, on_progress: Progress = quiet,
          draft_path: str | None = None) -> dict[str, Any]:
    """Train (or continue training) the adapter; returns ``evaluation.json``'s content."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if files.adapter.is_dir() and files.evaluation.is_file():
        return json.loads(files.evaluation.read_text())
    torch.manual_seed(spec.seed)
    path = draft_path or resolve_model(str(spec.draft))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = train_dtype(spec.train_dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    train_records, held_records = training_split(files, spec.held_out, spec.seed)
    train_set, skipped = examples(tokenizer, train_records, spec.max_length)
    held, skipped_held = examples(tokenizer, held_records, spec.max_length)
    skipped += skipped_held
    base = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    plan = [b for e in range(math.ceil(spec.epochs)) for b in batches(train_set, spec.batch_tokens, spec.seed, e)]
    plan = plan[:max(1, round(len(plan) * spec.epochs / math.ceil(spec.epochs)))]
    if files.checkpoint.is_dir():
        model = PeftModel.from_pretrained(base, files.checkpoint, is_trainable=True)
        state = torch.load(files.checkpoint / "state.pt", weights_only=False)
    else:
        config = LoraConfig(r=spec.lora_rank, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                            target_modules=list(spec.lora_modules), task_type="CAUSAL_LM")
        model, state = get_peft_model(base, config), None
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:  # the adapter's own weights train in float32 whatever the base computes in
        p.data = p.data.float()
    optimizer = torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=0.0)
    warmup = max(1, len(plan) // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (len(plan) - s) / max(1, len(plan) - warmup))))
    report: dict[str, Any] = {"train_solutions": len(train_set), "held_out_solutions": len(held),
                              "skipped_too_long": skipped, "optimizer_steps": len(plan), "dtype": str(dtype),
                              "device": str(device), "cpu": cpu_info()[0]}
    if state is None:
        on_progress("held-out loss before", 0, 1)
        report["before"] = evaluate(model, held, device)
        history, start = [{"before": report["before"]}], 0
    else:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        history, start = state["history"], state["step"]
        report["before"] = history[0]["before"]
    model.train()
    for step in range(start, len(plan)):
        t0 = time.perf_counter()
        tokens = sum(len(ex.input_ids) - ex.num_prompt for ex in plan[step])
        step_loss = 0.0
        for ex in plan[step]:
            loss, _, k = _loss_and_hits(model, ex, device)
            (loss * k / tokens).backward()  # the batch's mean over its solution tokens
            step_loss += float(loss.detach()) * k / tokens
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        history.append({"step": step + 1, "loss": round(step_loss, 4), "lr": scheduler.get_last_lr()[0],
                        "tokens": tokens, "seconds": round(time.perf_counter() - t0, 2)})
        on_progress("training", step + 1, len(plan))
        if (step + 1) % spec.checkpoint_every == 0 or step + 1 == len(plan):
            _save_checkpoint(files, model, optimizer, scheduler, step + 1, history)
    on_progress("held-out loss after", 0, 1)
    report["after"] = evaluate(model, held, device)
    report["history"] = history[1:]
    report["train_seconds"] = round(sum(h["seconds"] for h in history[1:]), 1)
    tmp = files / "adapter.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tmp.rename(files.adapter)
    atomic_write_json(files.evaluation, report)
    return report
