"""State shared by every strategy's loop: budgets, stop reasons, the growing trace.

:class:`TraceRun` is the trace being written and why it should stop; the driver
(:mod:`stepspec.orchestrator.driver`) owns its life, a strategy's policy writes its steps
through :meth:`TraceRun.write` and :meth:`TraceRun.keep`.

Engines are shared: several traces (``solve_many``) may run on the same two
engines at once, so a trace counts its own work through :class:`CountingEngine`
(calls, generated tokens, vLLM's per-request speculation counters) rather than
reading the engines' global counters.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from stepspec.engine.protocol import Engine
from stepspec.engine.stats import SpecDecodingStats
from stepspec.engine.types import FinishReason, GenerationRequest, GenerationResult
from stepspec.judges.base import Judge, StepCandidate, Verdict
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.goodput import GoodputGovernor, StepTicket
from stepspec.orchestrator.prompts import opening_messages
from stepspec.orchestrator.stepgen import GeneratedStep, generate_steps, opening_prompt, step_end, step_prompt
from stepspec.orchestrator.steps import StepRules, find_answer, inside_thinking, last_boxed, split_steps
from stepspec.orchestrator.trace import Author, StepEnd, StepRecord, StopReason, Trace, Work, join_steps


# The judge name of a drafted step rejected because its tool call is invalid.
TOOL_CALL_CHECK = "tool-call-check"


class ReasoningError(RuntimeError):
    """A trace could not finish; ``trace`` holds every step written before the failure."""

    def __init__(self, message: str, trace: Trace) -> None:
        super().__init__(message)
        self.trace = trace


class StepDelimiterError(ReasoningError):
    """Steps keep hitting the token cap and the delimiter never appears."""


class ModelClock:
    """Wall time during which at least one of a trace's model calls is in flight
    (calls overlap in lookahead: the union is counted, not the sum). A trace's
    orchestration time is its wall time minus this."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._in_flight = 0
        self._since = 0.0

    def __enter__(self) -> "ModelClock":
        if self._in_flight == 0:
            self._since = time.perf_counter()
        self._in_flight += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self.seconds += time.perf_counter() - self._since


class CountingEngine:
    """An engine as one trace sees it: this trace's generation calls, generated
    tokens, token-level speculation counters and time in model calls; everything
    else is the engine's."""

    def __init__(self, engine: Engine, clock: ModelClock | None = None) -> None:
        self.engine = engine
        self.clock = clock or ModelClock()
        self.num_generate_calls = 0
        self.num_generated_tokens = 0  # kept or not: all the tokens this trace asked for
        self.spec_decoding = SpecDecodingStats()

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.num_generate_calls += 1
        with self.clock:
            results = await self.engine.generate(requests)
        for r in results:
            for c in r.completions:
                self.num_generated_tokens += c.num_output_tokens
                if c.spec_decoding is not None:
                    self.spec_decoding.observe(c.spec_decoding)
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def open_step_text(steps: Sequence[StepRecord]) -> str:
    """The text of the step ``steps`` leave open: the pieces since their last complete step."""
    pieces = []
    for s in reversed(steps):
        if s.complete:
            break
        pieces.append(s.text)
    return "".join(reversed(pieces))


def written_step(index: int, author: Author, step: GeneratedStep, **judged: Any) -> StepRecord:
    """The record of a step ``author`` wrote, with any verdict fields."""
    return StepRecord.written(index, author, step.text, Work(step.num_tokens, step.seconds), complete=step.complete,
                              **judged)


def judged_fields(drafted: GeneratedStep, verdict: Verdict, judge_seconds: float = 0.0) -> dict[str, Any]:
    """The record fields of a drafted step and the verdict on it, for :func:`written_step`
    (with a token-level cut: the drafted tokens kept and where and why it was cut)."""
    fields: dict[str, Any] = dict(draft_text=drafted.text, accepted=verdict.accept, score=verdict.score,
                                  judge=verdict.judge, num_draft_tokens=drafted.num_tokens,
                                  draft_seconds=drafted.seconds, judge_seconds=judge_seconds)
    if verdict.cut is not None:
        fields.update(num_kept_tokens=verdict.cut.offset, cut=verdict.cut.to_dict())
    return fields


def repeats(steps: Sequence[StepRecord]) -> bool:
    """Whether the last step, complete, says again what the one before it said (a loop)."""
    return len(steps) >= 2 and steps[-1].complete and steps[-1].text.strip() == steps[-2].text.strip()


def draft_logprobs(judge: Judge, temperature: float = 0.0) -> int | None:
    """What a strategy asks of the draft for ``judge``: each token's logprob (0 = the
    sampled token's alone) when the judge reads the drafted tokens, else nothing; for a
    step it samples (``temperature`` > 0) and the judge tests by ratio, the judge's
    ``draft_top_k`` alternatives too."""
    if not judge.needs_draft_tokens:
        return None
    return judge.draft_top_k if temperature > 0 else 0


class TraceRun:
    """The trace being written, and why it should stop.

    A policy writes through it: :meth:`write` has a model write the next step (after
    the trace, or after other ``steps``), :meth:`keep` adds a written step to the
    trace, :meth:`judge` asks a judge, :meth:`end` stops a search's trace."""

    def __init__(self, question: str, strategy: str, rules: StepRules, budget: Budget,
                 engines: Mapping[str, Engine], on_step: Callable[[StepRecord], None] | None = None,
                 governor: GoodputGovernor | None = None) -> None:
        if not question or not question.strip():
            raise ValueError("the question is empty; give the problem text to reason about")
        self.question = question
        self.strategy = strategy
        self.rules = rules
        self.budget = budget
        self.clock = ModelClock()  # generation and judge calls: the models' share of the wall time
        self.engines = {role: CountingEngine(e, self.clock) for role, e in engines.items()}
        self.on_step = on_step
        self.steps: list[StepRecord] = []
        # Set once a step ends the trace (answer, eos, thinking, action) or a search ends it.
        self.ended: StopReason | None = None
        self.num_judge_calls = 0
        self._openings: dict[str, str] = {}
        self._t0 = time.perf_counter()
        # Goodput-aware speculation: the shared governor, and the decision awaiting its step.
        self.governor = governor
        # (the governor's ticket for the step, tokens then, how to count the tokens written)
        self._decision: tuple[StepTicket, int, Callable[[], int]] | None = None
        if governor is not None:
            governor.enter()

    def decide(self, written: Callable[[], int] | None = None, forced: Author | None = None,
               sample: bool = True) -> Author:
        """Who writes the next step(s): the governor's choice at the current load (always
        the draft without one), or ``forced``, the policy's own (the target's opening),
        which the governor counts as running but neither chooses nor takes as a sample.
        ``sample=False``: the governor's choice, but no sample either (a step with the
        question's prefill, whose seconds per token are not its mode's). What was written
        under it is observed at the next decision (or when the trace leaves): the trace's
        new tokens, or, for a search whose text is not yet the trace's, the new tokens
        that ``written`` counts."""
        if self.governor is None:
            return forced or Author.DRAFT
        self._observe_decision()
        mode = forced or self.governor.decide()
        count = written or (lambda: self.num_tokens)
        self._decision = (self.governor.begin(mode, measured=forced is None and sample), count(), count)
        return mode

    def _observe_decision(self) -> None:
        """Tell the governor what the last decision's mode wrote since it was made."""
        if self._decision is not None:
            ticket, tokens, count = self._decision
            self._decision = None
            self.governor.end(ticket, count() - tokens)

    def leave(self) -> None:
        """The trace is done with the governor (once; finish calls it too)."""
        if self.governor is not None:
            self._observe_decision()
            self.governor.exit()
            self.governor = None

    @property
    def step_texts(self) -> tuple[str, ...]:
        return tuple(s.text for s in self.steps)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.steps)

    def step_token_cap(self, ahead: Sequence[StepRecord] = ()) -> int:
        """Tokens the next step may use: the per-step cap, within what is left (after
        the ``ahead`` steps, when drafting past the trace)."""
        used = self.num_tokens + sum(s.num_tokens for s in ahead)
        return max(1, min(self.budget.max_step_tokens, self.budget.max_tokens - used))

    # -- writing ---------------------------------------------------------------------

    async def open(self) -> None:
        """Render the reasoning chat once per engine (awaited: a server may render it)."""
        for role, engine in self.engines.items():
            self._openings[role] = await opening_prompt(engine, self.question)

    def opening(self, role: Author) -> str:
        """The reasoning chat as ``role``'s engine renders it (rendered by :meth:`open`)."""
        return self._openings[role]

    def prompt(self, role: Author, steps: Sequence[StepRecord] | None = None) -> str:
        """What makes ``role``'s engine write the step after ``steps`` (default: the trace)."""
        return step_prompt(self.opening(role), self.steps if steps is None else steps, self.rules.delimiter)

    async def write(self, role: Author, steps: Sequence[StepRecord] | None = None, cap: int | None = None,
                    **sampling: Any) -> GeneratedStep:
        """One step by ``role``'s engine after ``steps`` (default: the trace); see :meth:`write_many`."""
        (step,) = await self.write_many(role, [self.steps if steps is None else steps], cap, **sampling)
        return step

    async def write_many(self, role: Author, bases: Sequence[Sequence[StepRecord]],
                         cap: int | Sequence[int] | None = None,
                         **sampling: Any) -> list[GeneratedStep]:
        """One step by ``role``'s engine after each of ``bases`` (the trace, or the trace and
        steps past it), in one batched call; each within ``cap`` tokens (default: what the
        budget leaves after its base). ``sampling``: :func:`generate_steps`'s keywords."""
        caps = [self.step_token_cap(b[len(self.steps):]) for b in bases] if cap is None else cap
        return await generate_steps(self.engines[role], [self.prompt(role, b) for b in bases], self.rules, caps,
                                    opens=[open_step_text(b) for b in bases], **sampling)

    async def rewrite(self, verdict: Verdict, steps: Sequence[StepRecord] | None = None,
                      cap: int | None = None) -> GeneratedStep:
        """The target's step after ``steps`` (default: the trace) where ``verdict`` rejected the
        draft's; see :meth:`rewrite_many`."""
        (step,) = await self.rewrite_many([verdict], [self.steps if steps is None else steps], cap=cap)
        return step

    async def rewrite_many(self, verdicts: Sequence[Verdict], bases: Sequence[Sequence[StepRecord]],
                           cap: int | None = None, **sampling: Any) -> list[GeneratedStep]:
        """The target's step after each of ``bases`` where its verdict rejected the draft's, in one
        batched call: after a token-level cut it keeps the drafted tokens before the cut and
        writes on from there (greedy: its first token is its own top choice at the cut);
        otherwise it writes the whole step. ``cap``: at most this many tokens each (1: only the
        target's token at the cut; the step stays open, ``complete=False``, unless that token ends
        it; greedy, the target's token at a cut is the one the verification already computed, read
        without a call where it can be: :meth:`_token_at_cut`). ``sampling``: temperature and seeds,
        to sample."""
        greedy_token = cap == 1 and not sampling.get("temperature")
        known = [await self._token_at_cut(v, b) if greedy_token else None for v, b in zip(verdicts, bases)]
        todo = [i for i, k in enumerate(known) if k is None]
        written = iter(await self._write_at_cuts([verdicts[i] for i in todo], [bases[i] for i in todo], cap, **sampling)
                       if todo else [])
        return [k if k is not None else next(written) for k in known]

    async def _write_at_cuts(self, verdicts: Sequence[Verdict], bases: Sequence[Sequence[StepRecord]],
                             cap: int | None, **sampling: Any) -> list[GeneratedStep]:
        """The target writes each step of :meth:`rewrite_many`, in one batched call."""
        cuts = [v.cut for v in verdicts]
        # a token resampled at the cut (sampling verifier) counts as the target's
        resampled = [int(c is not None and c.resampled_text is not None) for c in cuts]
        caps = [max(1, min(cap or math.inf, self.step_token_cap(b[len(self.steps):]) - (c.offset if c else 0) - r))
                for b, c, r in zip(bases, cuts, resampled)]
        heads = [(c.kept_text + (c.resampled_text or "")) if c is not None else "" for c in cuts]
        written = await self.write_many(Author.TARGET, bases, caps, heads=heads, **sampling)
        return [replace(w, num_tokens=w.num_tokens + r) for w, r in zip(written, resampled)]

    async def _token_at_cut(self, verdict: Verdict, steps: Sequence[StepRecord]) -> GeneratedStep | None:
        """The target's step piece at ``verdict``'s cut without a call: the kept drafted text and the
        target's greedy token there, which the verification already computed (one decoded token,
        the step left open unless it closes a ``\\boxed{}``). None where a call must write it: no
        greedy cut (a resampled token, none known), a token that ends generation (a special token,
        such as the end of the turn) or holds a stop string, part of a character, or an engine
        without a local tokenizer to tell."""
        cut = verdict.cut
        tokenizer = getattr(self.engines[Author.TARGET], "tokenizer", None)
        special = getattr(tokenizer, "all_special_ids", None)
        if cut is None or cut.resampled_text is not None or cut.target_token_id < 0 or special is None \
                or cut.target_token_id in special:
            return None
        text = await self.engines[Author.TARGET].adecode([cut.target_token_id])
        if not text or "\ufffd" in text or any(stop in text for stop in self.rules.stops):
            return None  # (a byte token of a longer character reads as U+FFFD alone: its text comes in context)
        prompt = self.prompt(Author.TARGET, steps)
        complete, ends = step_end(prompt, cut.kept_text + text, FinishReason.LENGTH, self.rules)
        return GeneratedStep(cut.kept_text + text, 1, complete, ends, 0.0, token_ids=(cut.target_token_id,))

    async def steps_in(self, author: Author, text: str) -> list[tuple[str, int]]:
        """The steps ``text`` holds (cut at the delimiter), each with its tokens in ``author``'s count."""
        texts = split_steps(text, self.rules.delimiter) or [text]
        return [(t, await self.engines[author].acount_tokens(t)) for t in texts]

    async def _write_run(self, author: Author, cap: int, **fields: Any) -> None:
        """``author`` writes on in one generation (no stop at the delimiter) of at most ``cap``
        tokens within the budget, kept as the steps it holds: split at the delimiter, each
        counted and timed by its share of the tokens, up to the step that ends the trace
        (``fields``: each record's). Example, cap 200: the target writes "9 * 2 = 18.\n\nShe
        makes \\boxed{18}.\n\nDone." in one call: two steps join the trace (the second ends
        it: its answer), the third is dropped."""
        piece = await self.write(author, cap=max(1, min(cap, self.budget.max_tokens - self.num_tokens)), until_end=True)
        split = await self.steps_in(author, piece.text)
        counts = [n for _, n in split]
        for i, (text, n) in enumerate(split):
            last = i == len(split) - 1
            boxed = last_boxed(text) is not None and not inside_thinking(self.prompt(author) + text, self.rules)
            work = Work(n, piece.seconds * n / max(1, sum(counts)))
            self._add(StepRecord.written(len(self.steps), author, text, work, complete=piece.complete or not last,
                                        **fields), piece.ends if last else StepEnd.TRACE if boxed else None)
            if self.stop_reason() is not None:
                return

    async def write_on(self, author: Author, run_tokens: int, **fields: Any) -> None:
        """``author`` writes the trace's next step(s) and keeps them (``fields``: each record's):
        with ``run_tokens``, up to that many tokens in one generation (:meth:`_write_run`);
        with 0, one step in one call."""
        if run_tokens:
            await self._write_run(author, run_tokens, **fields)
        else:
            self.keep(author, await self.write(author), **fields)

    def keep(self, author: Author, step: GeneratedStep, **fields: Any) -> None:
        """Add ``step``, written by ``author``, to the trace (``fields``: a verdict's)."""
        self._add(written_step(len(self.steps), author, step, **fields), step.ends)

    def candidate(self, drafted: GeneratedStep, previous: Sequence[StepRecord] | None = None,
                  target_step: str | None = None, temperature: float = 0.0, seed: int | None = None
                  ) -> StepCandidate:
        """What a judge sees of a step drafted after ``previous`` (default: the trace): its text
        in context and, for a token-level verifier, the target's prompt it continues and its tokens;
        ``exact`` when the step holds a tool call (``rules.calls``), with the spans its binding wrote (``forced``)."""
        previous = self.steps if previous is None else previous
        head = self.open_step_text() if previous is self.steps else ""
        exact = self.holds_call(head + drafted.text)
        forced = tuple((max(a - len(head), 0), b - len(head)) for a, b in self.rules.forced_spans(head + drafted.text)
                       if b > len(head))
        return StepCandidate(self.question, tuple(s.text for s in previous), drafted.text, target_step=target_step,
                             opening_messages=opening_messages(self.question), prefix=self.prompt(Author.TARGET, previous),
                             draft_token_ids=drafted.token_ids, draft_token_logprobs=drafted.token_logprobs,
                             draft_token_texts=drafted.token_texts, temperature=temperature,
                             draft_token_tops=drafted.token_tops, seed=seed, exact=exact, forced=forced,
                             starts_step=not head)

    def rating(self, text: str, previous: Sequence[StepRecord] = ()) -> StepCandidate:
        """What a judge rates on its own (a search's candidate, a whole solution): ``text``
        after ``previous``, without the prompt or tokens a token-level verifier reads."""
        return StepCandidate(self.question, tuple(s.text for s in previous), text,
                             opening_messages=opening_messages(self.question))

    def _add(self, record: StepRecord, ends: StepEnd | None = None) -> None:
        """Append a step; ``ends`` is what it ends (its GeneratedStep.ends)."""
        calls = self.rules.calls
        if ends is not StepEnd.THINKING and calls is not None:
            holds = self.holds_call(self.open_step_text() + record.text)  # written in one piece or several
            if not calls.several:
                ends = StepEnd.ACTION if holds and record.complete else ends  # a tool call: the agent runs it
            elif record.complete and ((holds and ends is not None) or (not holds and self.calls_written())):
                ends = StepEnd.ACTION  # the last of the turn's calls: the model stopped, or wrote no other
            if calls.several and holds and calls.repeated(join_steps([*self.steps, record], self.rules.delimiter)):
                ends = StepEnd.ACTION  # a call written again, whole step or cut piece: a loop ends the turn
        self.steps.append(record)
        if ends is StepEnd.ACTION:
            self.ended = StopReason.ACTION  # an agent's tool call: the agent runs it and continues the chat
        elif ends is StepEnd.TRACE:
            self.ended = StopReason.ANSWER if find_answer(record.text, self.rules) is not None else StopReason.EOS
        elif ends is StepEnd.THINKING:
            self.ended = StopReason.THINKING
        if self.on_step is not None:
            self.on_step(record)
        n = self.budget.max_cut_steps
        if (n is not None and not self.ended and len(self.steps) >= n and not any(s.complete for s in self.steps[-n:])
                and self.rules.delimiter not in join_steps(self.steps, self.rules.delimiter)):
            raise StepDelimiterError(
                f"the step delimiter {self.rules.delimiter!r} never appeared: {n} steps in a row were cut at "
                f"max_step_tokens={self.budget.max_step_tokens}. Set the delimiter to what this model writes "
                f"between steps (e.g. '\\n'), or raise max_step_tokens / max_cut_steps",
                self.finish(StopReason.ERROR, error="step delimiter never appeared"))

    def adopt(self, steps: Sequence[StepRecord], ends: StepEnd | None, stop: StopReason) -> None:
        """A search's chosen steps join the trace, the last with what it ``ends``; the trace stops
        for ``stop`` unless one of them ended it."""
        for i, record in enumerate(steps):
            self._add(record, ends if i == len(steps) - 1 else None)
        self.ended = self.ended or StopReason(stop)

    async def judge(self, judge: Judge, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        """``judge``'s verdicts on ``candidates``; a drafted tool call that
        ``rules.calls`` finds invalid is rejected whole without asking it. Under a call
        constraint (``rules.calls.constraint``) a cut in a drafted step that holds a call rejects the step whole: the
        target writes the step again from its start, the call bound from its opening (a
        continuation from inside a call, or from a kept opening, would be free)."""
        head = self.open_step_text()  # a drafted piece continues the step written so far
        invalid = {i for i, c in enumerate(candidates) if self.invalid_call(head + c.draft_step) is not None}
        asked = [c for i, c in enumerate(candidates) if i not in invalid]
        with self.clock:
            verdicts = iter(await judge.judge(asked) if asked else [])
        out = [Verdict(TOOL_CALL_CHECK, False) if i in invalid else next(verdicts) for i in range(len(candidates))]
        self.num_judge_calls += sum(v.num_judge_calls for v in out)
        if self.rules.calls is not None and self.rules.calls.constraint is not None:
            # a cut in a step that holds a call: written again whole, bound
            out = [replace(v, cut=None) if v.cut is not None and self.holds_call(head + c.draft_step) else v
                   for v, c in zip(out, candidates)]
        return out

    def open_step_text(self) -> str:
        """The text of the step being written: the pieces since the last complete step."""
        return open_step_text(self.steps)

    def calls_written(self) -> bool:
        """Whether a complete step of the trace holds a tool call."""
        pieces = ""
        for s in self.steps:
            pieces += s.text
            if s.complete:
                if self.holds_call(pieces):
                    return True
                pieces = ""
        return False

    def holds_call(self, text: str) -> bool:
        """Whether ``text`` (a step, with the open step's pieces before it) holds a tool call
        (``rules.calls``)."""
        return self.rules.holds_call(text)

    def invalid_call(self, text: str) -> str | None:
        """Why the call ``text`` makes is invalid (``rules.calls.problem``), or None (no call, or a good one)."""
        if self.rules.calls is None or not self.holds_call(text):
            return None
        return self.rules.calls.problem(text)

    # -- stopping --------------------------------------------------------------------

    def stop_reason(self, ahead: Sequence[StepRecord] = ()) -> StopReason | None:
        """Why the trace should stop now, or None to write another step. THINKING: the
        </think> block closed; the driver has the answer written (:meth:`write_answer`).
        ``ahead``: steps drafted past the trace, judged as if they were already in it
        (that ends no trace by itself: a drafter stops at a step that ends one)."""
        if self.ended:
            return self.ended
        steps = [*self.steps, *ahead]
        if repeats(steps):
            return StopReason.REPETITION
        if len(steps) >= self.budget.max_steps:
            return StopReason.MAX_STEPS
        if sum(s.num_tokens for s in steps) >= self.budget.max_tokens:
            return StopReason.MAX_TOKENS
        if self.budget.max_seconds is not None and time.perf_counter() - self._t0 >= self.budget.max_seconds:
            return StopReason.TIMEOUT
        return None

    async def write_answer(self, author: Author) -> StopReason:
        """After ``</think>`` (or a router's "stop"): ``author``'s engine writes the final
        answer in one piece, within the tokens left. Returns the trace's stop reason."""
        step = await self.write(author, cap=max(1, self.budget.max_tokens - self.num_tokens), until_end=True)
        self._add(written_step(len(self.steps), author, step))
        self.ended = (StopReason.ANSWER if find_answer(step.text, self.rules) is not None
                      else StopReason.EOS if step.complete else StopReason.MAX_TOKENS)
        return self.ended

    def finish(self, stop_reason: StopReason, error: str | None = None, search: dict[str, Any] | None = None) -> Trace:
        self.leave()
        steps = tuple(self.steps)
        return Trace(
            question=str(self.question),  # a Chat's task text; its messages are the agent's to keep
            strategy=self.strategy,
            steps=steps,
            answer=find_answer(join_steps(steps, self.rules.delimiter), self.rules),
            stop_reason=stop_reason,
            seconds=time.perf_counter() - self._t0,
            spec_decoding={role: e.spec_decoding.to_dict() for role, e in self.engines.items()},
            num_generate_calls={role: e.num_generate_calls for role, e in self.engines.items()},
            num_generated_tokens={role: e.num_generated_tokens for role, e in self.engines.items()},
            num_judge_calls=self.num_judge_calls,
            model_seconds=self.clock.seconds,
            error=error,
            delimiter=self.rules.delimiter,
            search=search,
        )
