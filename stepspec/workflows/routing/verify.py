r"""``stepspec router verify``: the likelihood verifier's verdict on every collected drafted step.

The router's default label (:mod:`stepspec.routers.train`, ``verifier``) is whether the
target's likelihood verifier (:class:`stepspec.judges.likelihood.LikelihoodJudge`, its
typed rules by default) cuts a drafted step: the steps ``specreason`` with that
judge sends to the target. This pass scores every example of a collection once:
the target reads the drafted step's tokens after the step's prompt (one
prefill per step, a batch at a time) and the judge's rules give the verdict.
Each verdict is a line of ``verdicts.jsonl`` (:class:`stepspec.routers.base.VerifiedStep`)
beside ``examples.jsonl``; ``verify.json`` holds the judge options and the
sessions. Run it again and it goes on where it stopped (a verified step is
never scored twice); other judge options need another collection copy.

The drafted tokens are the step's text as the collection kept it, re-encoded by
the target's tokenizer, not the ids the draft generated (the pair shares one
tokenizer, and a generated text re-encodes to the same ids nearly always), and
the stop token as generation ended the step (:func:`stop_text`): the delimiter
after a complete step, nothing after a boxed answer or at the token cap. The
stop matters: Qwen's tokenizer merges the delimiter into the token before it
(``.\n\n``), so a step scored without it ends on a token the target would not
write there (79% of the collected steps cut), and an answer step scored with it
ends on one the target would not write either (``).\n\n`` where it ends the
answer: 26 of the 231 steps the target wrote word for word cut). The step's
prompt is the reasoning chat and the previous steps joined by the delimiter, as
:func:`stepspec.orchestrator.stepgen.step_prompt` builds it (previous steps taken as
complete: a step cut by the token cap was followed by one that continued it).

Worked example (made up): a step "So she has 16 - 3 = 12 eggs." after two steps; the target
gives " 12" a logprob of -7.9 (not its top token, a digit): the typed rules cut
it at offset 9, so the line reads cut true, plausible 0.92, cut_token " 12".
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from stepspec.common.files import append_jsonl, atomic_write_json
from stepspec.engine.config import build_engines
from stepspec.engine.protocol import Engine
from stepspec.judges.base import StepCandidate
from stepspec.judges.registry import judge_options_model, make_judge
from stepspec.orchestrator.stepgen import opening_prompt, step_prompt
from stepspec.orchestrator.trace import Author, StepRecord
from stepspec.orchestrator.prompts import opening_messages
from stepspec.orchestrator.steps import last_boxed
from stepspec.routers.base import RouterError, RoutingExample, RoutingState, VerifiedStep
from stepspec.routers.train import EXAMPLES_FILE, VERDICTS_FILE, read_examples, read_verdicts
from stepspec.workflows.eval.rundir import git_hash, versions
from stepspec.workflows.routing.collect import CollectError, CollectFiles, CollectSettings

VERIFY_FILE = "verify.json"


def stop_text(state: RoutingState, delimiter: str) -> str:
    """The text the drafted step's stop token held, as the step generator ended it: the
    delimiter after a complete step, nothing after the answer (a closed ``\\boxed{}``:
    EOS or the box's close ended it) or at the token cap."""
    return delimiter if state.complete and last_boxed(state.draft_step) is None else ""


async def step_candidates(engine: Engine, examples: Sequence[RoutingExample], delimiter: str,
                          openings: dict[str, str]) -> list[StepCandidate]:
    """What the likelihood judge reads of each collected drafted step (``openings``: the
    rendered reasoning chat by question, filled in as needed)."""
    out = []
    for ex in examples:
        s = ex.state
        if s.question not in openings:
            openings[s.question] = await opening_prompt(engine, s.question)
        # previous steps taken as complete (the collection does not keep which were cut by the cap)
        previous = [StepRecord(i, Author.DRAFT, text) for i, text in enumerate(s.previous_steps)]
        prefix = step_prompt(openings[s.question], previous, delimiter)
        ids = await engine.aencode(s.draft_step + stop_text(s, delimiter))
        texts = [await engine.adecode([t]) for t in ids]
        # the draft's logprobs line up with the tokens only when the re-encoding gave as many
        lps = s.token_logprobs if len(s.token_logprobs) == len(ids) else ()
        out.append(StepCandidate(s.question, s.previous_steps, s.draft_step,
                                 opening_messages=opening_messages(s.question), prefix=prefix,
                                 draft_token_ids=tuple(ids), draft_token_logprobs=tuple(lps),
                                 draft_token_texts=tuple(texts)))
    return out


async def verify_collection(directory: str | Path, *, judge_options: dict[str, Any] | None = None,
                            batch_size: int = 32, engine: Engine | None = None,
                            on_batch: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Verify every not yet verified example of the collection in ``directory``; returns
    counts (verified, cut share). ``engine``: the target instead of the collection's model
    (tests). ``on_batch(done, total)`` after each batch is saved."""
    if batch_size < 1:
        raise RouterError(f"batch size must be >= 1, got {batch_size}")
    files = CollectFiles(Path(directory))
    if not files.config.is_file():
        raise CollectError(f"{directory} holds no collection ({files.config.name} is missing); collect one first "
                           "with `stepspec router collect`")
    spec = CollectSettings.model_validate(json.loads(files.config.read_text())["config"])
    options = judge_options_model("likelihood").build(**(judge_options or {})).model_dump(mode="json")
    info_path = files.directory / VERIFY_FILE
    info: dict[str, Any] = {"judge": "likelihood", "judge_options": options, "sessions": []}
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        if info["judge_options"] != options:
            raise RouterError(f"{directory} was verified with other likelihood options ({info['judge_options']}); "
                              f"give the same options to go on, or copy {EXAMPLES_FILE} to a new directory")
    examples, _ = read_examples(files.directory / EXAMPLES_FILE)
    done = read_verdicts(files.directory / VERDICTS_FILE)
    # a problem's steps one after another: each step's prompt extends the one before it,
    # so the target's prefix cache holds most of it
    todo = sorted((ex for ex in examples if (ex.problem_id, ex.state.position) not in done),
                  key=lambda ex: (ex.problem_id, ex.state.position))
    session: dict[str, Any] = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "num_verified": 0, "seconds": 0.0, "versions": versions(), "git_hash": git_hash()}
    info["sessions"].append(session)
    atomic_write_json(info_path, info)
    if todo:
        owned = engine is None
        if engine is None:
            config = spec.reasoner_config()
            engine = build_engines({Author.TARGET: config.target}, names={Author.TARGET: spec.target})[Author.TARGET]
        judge = make_judge("likelihood", engine=engine, **options)
        t0 = time.perf_counter()
        try:
            await engine.start()
            openings: dict[str, str] = {}
            for start in range(0, len(todo), batch_size):
                batch = todo[start:start + batch_size]
                scorable = [ex for ex in batch if ex.state.draft_step]  # an empty step has nothing to cut
                verdicts = dict(zip((id(ex) for ex in scorable), await judge.judge(
                    await step_candidates(engine, scorable, spec.delimiter, openings)) if scorable else []))
                for ex in batch:
                    v = verdicts.get(id(ex))
                    cut = None if v is None else v.cut
                    at = {} if cut is None else {"cut_offset": cut.offset, "cut_token": cut.token,
                                                 "cut_logprob": cut.target_logprob}
                    plausible = 1.0 if v is None or v.plausible is None else v.plausible
                    verdict = VerifiedStep(ex.problem_id, ex.state.position, cut is not None, plausible, **at)
                    append_jsonl(files.directory / VERDICTS_FILE, verdict.to_dict())
                    done[verdict.problem_id, verdict.position] = verdict
                session["num_verified"] += len(batch)
                session["seconds"] = time.perf_counter() - t0
                atomic_write_json(info_path, info)
                if on_batch is not None:
                    on_batch(session["num_verified"], len(todo))
        finally:
            session["seconds"] = time.perf_counter() - t0
            atomic_write_json(info_path, info)
            if owned:
                await engine.close()
    n = len(done)
    return {"directory": str(files.directory), "num_examples": len(examples), "num_verified": n,
            "cut_share": sum(v.cut for v in done.values()) / n if n else None,
            "mean_plausible": sum(v.plausible for v in done.values()) / n if n else None}
