"""Generate one reasoning step per prompt, batched, with any engine.

A step ends at the delimiter (vLLM stop string), at the end of the answer (EOS
or a closed ``\\boxed{}``), or at the per-step token cap. A delimiter inside an
open fenced code block does not end the step: generation goes on from there.
A step cut by the cap is returned with ``complete=False``; the next step then
continues it directly (see :func:`stepspec.orchestrator.trace.join_steps`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

from stepspec.engine.protocol import Engine
from stepspec.engine.types import FinishReason, GenerationRequest, Sampling, TokenLogprob
from stepspec.orchestrator.prompts import Chat, RawPrompt, question_tools, reasoning_messages
from stepspec.orchestrator.steps import StepRules, constraint_after, inside_code_block, inside_thinking, last_boxed
from stepspec.orchestrator.trace import StepEnd, StepRecord, join_steps


@dataclass(frozen=True)
class GeneratedStep:
    text: str
    num_tokens: int
    complete: bool  # ended at the delimiter or the end of the answer, not at the cap
    ends: StepEnd | None  # what this step ends, if anything
    seconds: float
    # With ``logprobs`` asked of generate_steps, per generated token: its logprob and
    # the entropy of the next-token distribution over the top alternatives (nats).
    token_logprobs: tuple[float, ...] = ()
    token_entropies: tuple[float, ...] = ()
    # Every generated token id, the stop token included (a verifier scores the step's
    # end too); with ``logprobs`` asked, each token's text (they join to the text).
    token_ids: tuple[int, ...] = ()
    token_texts: tuple[str, ...] = ()
    # With ``logprobs`` > 0 asked, per generated token: its model's top alternatives as
    # (token id, raw logprob) (a sampling verifier's draft distribution).
    token_tops: tuple[tuple[tuple[int, float], ...], ...] = ()


def top_k_entropy(token: TokenLogprob) -> float:
    """Entropy (nats) of the next-token distribution as far as its top-k shows it:
    the top alternatives (the sampled token among them) plus one bucket for the
    probability mass left over. A lower bound of the true entropy; 0 for a sure token."""
    probs = {tid: math.exp(lp) for tid, _, lp in token.top}
    probs.setdefault(token.token_id, math.exp(token.logprob))
    rest = max(0.0, 1.0 - sum(probs.values()))
    return -sum(p * math.log(p) for p in [*probs.values(), rest] if p > 0)


async def opening_prompt(engine: Engine, question: str) -> str:
    """The reasoning chat rendered by ``engine``'s template, up to the assistant's turn.
    Constant for a trace: render it once per engine, not once per step (through an
    OpenAI server without a local tokenizer a rendering costs three HTTP calls).
    A :class:`RawPrompt` is its own opening; a :class:`Chat` renders with its tools, and
    its prefill opens the assistant's turn (a Chat that carries this engine's rendering,
    :meth:`Chat.with_opening`, is not rendered again)."""
    if isinstance(question, RawPrompt):
        return str(question)
    if isinstance(question, Chat) and engine.info.model in question.openings:
        return question.openings[engine.info.model]
    opening = await engine.aapply_chat_template(reasoning_messages(question), tools=question_tools(question))
    return opening + (question.prefill if isinstance(question, Chat) else "")


def step_prompt(opening: str, steps: Sequence[StepRecord], delimiter: str) -> str:
    """The prompt that makes an engine write the next step after ``steps``, given
    its :func:`opening_prompt`."""
    prompt = opening + join_steps(steps, delimiter)
    if steps and steps[-1].complete:
        prompt += delimiter
    return prompt


def step_end(prompt: str, text: str, finish: FinishReason, rules: StepRules,
             stop_string: str | None = None) -> tuple[bool, StepEnd | None]:
    """(complete, what it ends) of a step ``text`` after ``prompt`` whose generation finished with
    ``finish`` (at ``stop_string``): complete unless it ran into the token cap, where a closed
    ``\\boxed{}`` (outside the thinking) completes it and ends the trace, as the end of the answer
    does. A step holding a tool call ends the trace for its call to run; where a turn may write
    several (``rules.calls.several``) only where the model stops to read a result (the trace
    decides the rest as each step joins the trace, :class:`stepspec.orchestrator.run.TraceRun`)."""
    boxed = last_boxed(text) is not None and not inside_thinking(prompt + text, rules)
    complete = finish is not FinishReason.LENGTH or boxed
    ends = StepEnd.TRACE if finish is FinishReason.EOS or boxed else None
    calls = rules.calls
    if complete and calls is not None and rules.holds_call(text) and (
            not calls.several or (stop_string is not None and stop_string == calls.stop)):
        ends = StepEnd.ACTION  # a tool call: the agent runs it before anything else is written
    return complete, ends


async def generate_steps(
    engine: Engine,
    prompts: Sequence[str],
    rules: StepRules,
    max_step_tokens: int | Sequence[int],
    temperature: float = 0.0,
    seed: int | Sequence[int | None] | None = None,
    until_end: bool = False,
    logprobs: int | None = None,
    heads: Sequence[str] | None = None,
    opens: Sequence[str] | None = None,
) -> list[GeneratedStep]:
    """One step for each prompt, in one batched call (more only for code blocks).

    ``max_step_tokens``: one cap for all, or one per prompt; ``seed`` likewise (sampled
    siblings of one prompt need seeds of their own). ``until_end``: no
    delimiter stop; write until EOS or the cap (the answer after ``</think>``).
    ``logprobs``: return each token's logprob and top-``logprobs`` entropy (what a
    router reads about the draft's confidence). ``heads``: text each step already
    starts with (the kept part of a cut drafted step); generation continues after it,
    the returned text includes it and ``num_tokens`` counts only what was generated.
    ``opens``: the open step's pieces each prompt already ends with (a step continued); with
    ``rules.calls.constraint`` a generation follows it unless a call is already open there or in
    its head (:func:`~stepspec.orchestrator.steps.constraint_after`)."""
    t0 = time.perf_counter()
    caps = [max_step_tokens] * len(prompts) if isinstance(max_step_tokens, int) else list(max_step_tokens)
    seeds = [seed] * len(prompts) if seed is None or isinstance(seed, int) else list(seed)
    texts = list(heads) if heads is not None else [""] * len(prompts)
    before = list(opens) if opens is not None else [""] * len(prompts)
    num_tokens = [0] * len(prompts)
    ended: list[tuple[bool, str | None] | None] = [None] * len(prompts)  # (complete, ends)
    token_logprobs: list[list[float]] = [[] for _ in prompts]
    token_entropies: list[list[float]] = [[] for _ in prompts]
    token_ids: list[list[int]] = [[] for _ in prompts]
    token_texts: list[list[str]] = [[] for _ in prompts]
    token_tops: list[list[tuple[tuple[int, float], ...]]] = [[] for _ in prompts]
    stop = tuple(s for s in rules.stops if s != rules.delimiter) if until_end else rules.stops
    pending = list(range(len(prompts)))
    while pending:
        requests = [
            GenerationRequest(
                prompts[i] + texts[i],
                Sampling(max_tokens=caps[i] - num_tokens[i], temperature=temperature, seed=seeds[i], stop=stop,
                         logprobs=logprobs, structured=constraint_after(rules, before[i] + texts[i])),
            )
            for i in pending
        ]
        results = await engine.generate(requests)
        still = []
        for i, r in zip(pending, results):
            c = r.completion
            texts[i] += c.text
            num_tokens[i] += c.num_output_tokens
            token_ids[i].extend(c.token_ids)
            for t in c.logprobs or ():
                token_logprobs[i].append(t.logprob)
                token_entropies[i].append(top_k_entropy(t))
                token_texts[i].append(t.token)
                token_tops[i].append(tuple((tid, lp) for tid, _, lp in t.top))
            if c.finish_reason is FinishReason.STOP and c.stop_string == rules.think_end:
                texts[i] += rules.think_end
                ended[i] = (True, StepEnd.THINKING)
                continue
            if c.finish_reason is FinishReason.STOP and inside_code_block(texts[i]) and num_tokens[i] < caps[i]:
                texts[i] += rules.delimiter  # a blank line inside code: the step goes on
                still.append(i)
                continue
            ended[i] = step_end(prompts[i], texts[i], c.finish_reason, rules, c.stop_string)
        pending = still
    seconds = time.perf_counter() - t0
    return [GeneratedStep(text, n, complete, ends, seconds, tuple(lps), tuple(ents), tuple(ids), tuple(tts),
                          tuple(tops) if any(tops) else ())
            for text, n, (complete, ends), lps, ents, ids, tts, tops
            in zip(texts, num_tokens, ended, token_logprobs, token_entropies, token_ids, token_texts, token_tops)]
