"""Traces: what happened at every reasoning step, and the run's totals.

Step level only: a *step* is a piece of reasoning between delimiters; *tokens*
are counted per engine. Token-level speculation counters (vLLM's) are kept
apart, under ``spec_decoding``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from stepspec.common.counts import summed
from stepspec.common.states import Author
from stepspec.engine.stats import SpecDecodingStats


class StepEnd(StrEnum):
    """What a generated step ends, if anything (``GeneratedStep.ends``; None: nothing)."""

    TRACE = "trace"  # EOS, or a boxed answer outside any <think> block
    THINKING = "thinking"  # it closed the </think> block
    ACTION = "action"  # it holds a tool call (StepRules.calls)


class StopReason(StrEnum):
    """Why a trace stopped (``Trace.stop_reason``); result files hold the same strings."""

    ANSWER = "answer"  # a step ended the trace (EOS or a closed \boxed{}) and the text has an answer
    EOS = "eos"  # a step ended the trace, and no answer is found in the text
    # The </think> block closed: the driver has the answer written after it, so a finished
    # trace stops for that answer's reason instead (a step state, never a final one today).
    THINKING = "thinking"
    ACTION = "action"  # a step holds a tool call (StepRules.calls): the agent runs it
    MAX_STEPS = "max_steps"  # Budget.max_steps steps written
    MAX_TOKENS = "max_tokens"  # Budget.max_tokens tokens of text (a search: its chosen branch)
    TIMEOUT = "timeout"  # Budget.max_seconds passed
    REPETITION = "repetition"  # the same complete step twice in a row
    ERROR = "error"  # an engine failed or the delimiter never appeared (Trace.error says which)
    MAX_DEPTH = "max_depth"  # tree: max_depth searched with branches still open (the best open one is kept)
    TOKEN_BUDGET = "token_budget"  # tree: the whole tree generated its token_budget (the best open one is kept)


@dataclass(frozen=True)
class Work:
    """One author's share of a step: the tokens it wrote and the seconds it took."""

    num_tokens: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class StepRecord:
    """One step of the final trace and how it got there.

    ``author`` is "draft" (a drafted step that was accepted) or "target" (the
    target wrote it: baseline, first steps, or a regeneration after rejection).
    Each author's counters are fields of their own (``num_draft_tokens``,
    ``draft_seconds``; ``num_target_tokens``, ``target_seconds``): :meth:`written`
    fills the author's from a :class:`Work`, :meth:`work` reads them back.
    """

    index: int
    author: Author
    text: str
    draft_text: str | None = None  # the drafted step that was judged (None: none drafted)
    accepted: bool | None = None  # the judge's verdict on the draft (None: not judged)
    score: float | None = None  # the judge's score of the draft (a router's: its p_target)
    judge: str | None = None  # which judge (or cascade rung, or router) decided
    target_score: float | None = None  # the judge's score of the target's step (arbitrage-oracle)
    num_draft_tokens: int = 0  # tokens the draft model wrote for this step
    num_target_tokens: int = 0  # tokens of the target's text for this step (its own, kept)
    # Tokens the target wrote at this position only to check the draft (lookahead:
    # its version of a step whose draft was accepted); not part of the trace's text.
    num_verify_tokens: int = 0
    complete: bool = True  # False: cut by the per-step token cap
    # Partial acceptance (a token-level verifier cut the drafted step): how many drafted
    # tokens were kept before the cut, and the cut (offset, token, target and draft
    # logprobs, rank, rule, the target's own token id); the target wrote the rest.
    num_kept_tokens: int = 0
    cut: dict[str, Any] | None = None
    # The target wrote this step without a draft because, at the measured load,
    # drafting did not pay (goodput-aware speculation, stepspec/orchestrator/goodput.py).
    backoff: bool = False
    draft_seconds: float = 0.0
    judge_seconds: float = 0.0  # judge or router
    target_seconds: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "author", Author(self.author))

    @classmethod
    def written(cls, index: int, author: Author, text: str, work: Work, **fields: Any) -> "StepRecord":
        """The record of a step ``author`` wrote: ``work`` goes to that author's counters;
        ``fields`` (a verdict's, the drafted step's own counters) are set as given."""
        author = Author(author)
        counters = (dict(num_draft_tokens=work.num_tokens, draft_seconds=work.seconds) if author is Author.DRAFT
                    else dict(num_target_tokens=work.num_tokens, target_seconds=work.seconds))
        return cls(index, author, text, **{**counters, **fields})

    def work(self, author: Author) -> Work:
        """What ``author`` did for this step (kept or not)."""
        if Author(author) is Author.DRAFT:
            return Work(self.num_draft_tokens, self.draft_seconds)
        return Work(self.num_target_tokens, self.target_seconds)

    @property
    def num_tokens(self) -> int:
        """Tokens of this step's final text: the draft's if it was kept whole, else the
        target's plus the drafted tokens kept before a cut."""
        return self.num_draft_tokens if self.author is Author.DRAFT else self.num_target_tokens + self.num_kept_tokens


@dataclass(frozen=True)
class Trace:
    question: str
    strategy: str
    steps: tuple[StepRecord, ...]
    answer: str | None
    stop_reason: StopReason
    seconds: float
    # Per engine role ("draft", "target"): this trace's token-level speculation
    # counters (vLLM's, summed per request), generation calls, and every token the
    # engine generated for it, kept or discarded.
    spec_decoding: dict[str, Any] = field(default_factory=dict)
    num_generate_calls: dict[str, int] = field(default_factory=dict)
    num_generated_tokens: dict[str, int] = field(default_factory=dict)
    num_judge_calls: int = 0  # model calls the judge made (prompts scored)
    # Wall time with at least one model call (generation or judge) in flight; the
    # rest of ``seconds`` is orchestration: step splitting, prompts, bookkeeping.
    model_seconds: float = 0.0
    error: str | None = None
    delimiter: str = "\n\n"
    # Search strategies (tree, best-of-n): what was explored beside the chosen steps
    # (the tree as node-link data, the samples and their votes, the judge queue's stats).
    search: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_reason", StopReason(self.stop_reason))

    @property
    def text(self) -> str:
        return join_steps(self.steps, self.delimiter)

    @property
    def num_tokens(self) -> int:
        """Tokens of the trace's own text (accepted drafts plus target-written steps)."""
        return sum(s.num_tokens for s in self.steps)

    @property
    def num_draft_tokens(self) -> int:
        """Tokens the draft wrote for the trace's steps, kept or rejected."""
        return sum(s.num_draft_tokens for s in self.steps)

    @property
    def num_target_tokens(self) -> int:
        return sum(s.num_target_tokens for s in self.steps)

    @property
    def num_drafted_steps(self) -> int:
        return sum(1 for s in self.steps if s.draft_text is not None)

    @property
    def num_accepted_steps(self) -> int:
        return sum(1 for s in self.steps if s.accepted)

    @property
    def num_cut_steps(self) -> int:
        """Drafted steps a token-level verifier cut (partly kept, the target wrote the rest)."""
        return sum(1 for s in self.steps if s.cut is not None)

    @property
    def num_kept_draft_tokens(self) -> int:
        """Drafted tokens in the trace's text: whole accepted steps plus prefixes kept before cuts."""
        return sum(s.num_draft_tokens if s.author is Author.DRAFT else s.num_kept_tokens for s in self.steps)

    @property
    def num_backoff_steps(self) -> int:
        return sum(1 for s in self.steps if s.backoff)

    def whole_steps(self) -> list[tuple[StepRecord, ...]]:
        """The records grouped by step: a step cut into pieces is several records, all but
        its last ``complete=False``."""
        groups: list[tuple[StepRecord, ...]] = []
        start = 0
        for i, s in enumerate(self.steps):
            if s.complete or i == len(self.steps) - 1:
                groups.append(self.steps[start:i + 1])
                start = i + 1
        return groups

    def last_step_apart(self) -> tuple[str, str]:
        """(the text of every step before the last; the last step's text, all its pieces): a
        reply's reasoning and its answer, or an agent's thoughts and the step holding its call."""
        steps = self.whole_steps()
        before = join_steps([record for step in steps[:-1] for record in step], self.delimiter)
        return before, join_steps(steps[-1] if steps else (), self.delimiter)

    def tool_call_steps(self) -> dict[str, int]:
        """The steps that hold a tool call, apart from reasoning steps (the step that ended a
        trace with stop reason "action": one at most): how many, how many were drafted, kept
        as drafted (every drafted piece accepted), and cut or rejected; and their tokens the
        draft wrote (``draft_tokens``) and of those the ones kept in the text (``kept_tokens``).

        Worked example: the draft writes ``{"name": "multiply", "arguments": {"a": 12,
        "b": 31}}`` (20 tokens), the verifier cuts at ``31`` (the target's token is ``13``)
        and the target writes the rest: one tool-call step, drafted 1, kept 0, cut 1,
        draft_tokens 20, kept_tokens 17."""
        calls = self.whole_steps()[-1:] if self.stop_reason is StopReason.ACTION else []
        drafted = [g for g in calls if any(s.draft_text is not None for s in g)]
        kept = [g for g in drafted if all(s.accepted for s in g if s.draft_text is not None)]
        records = [s for g in drafted for s in g]
        return {"steps": len(calls), "drafted": len(drafted), "kept": len(kept), "cut": len(drafted) - len(kept),
                "draft_tokens": sum(s.num_draft_tokens for s in records),
                "kept_tokens": sum(s.num_draft_tokens if s.author is Author.DRAFT else s.num_kept_tokens
                                   for s in records)}

    @property
    def step_acceptance_rate(self) -> float | None:
        n = self.num_drafted_steps
        return self.num_accepted_steps / n if n else None

    @property
    def target_token_share(self) -> float | None:
        """Share of the trace's tokens that the target wrote."""
        return self.num_target_tokens / self.num_tokens if self.num_tokens else None

    @property
    def num_target_calls(self) -> int:
        """Calls to the target model: its generation batches plus the judge's prompts
        (the judges that ask a model ask the target)."""
        return self.num_generate_calls.get(Author.TARGET, 0) + self.num_judge_calls

    def stats(self) -> dict[str, Any]:
        """The run's numbers, for people and result files."""
        return {
            "stop_reason": self.stop_reason,
            "seconds": self.seconds,
            "model_seconds": self.model_seconds,
            "num_steps": len(self.steps),
            "num_drafted_steps": self.num_drafted_steps,
            "num_accepted_steps": self.num_accepted_steps,
            "step_acceptance_rate": self.step_acceptance_rate,
            "num_cut_steps": self.num_cut_steps,
            "num_kept_draft_tokens": self.num_kept_draft_tokens,
            "num_backoff_steps": self.num_backoff_steps,
            "tool_call_steps": self.tool_call_steps(),
            "judge_seconds": sum(s.judge_seconds for s in self.steps),
            "draft_seconds": sum(s.draft_seconds for s in self.steps),  # drafting, kept or not
            "target_seconds": sum(s.target_seconds for s in self.steps),  # the target's writing
            "num_tokens": self.num_tokens,
            "num_draft_tokens": self.num_draft_tokens,
            "num_target_tokens": self.num_target_tokens,
            "target_token_share": self.target_token_share,
            "num_generated_tokens": dict(self.num_generated_tokens),
            "num_target_calls": self.num_target_calls,
            "num_judge_calls": self.num_judge_calls,
            "spec_decoding": self.spec_decoding,
            # a search's summary (its tree or samples stay in ``search``)
            "search": {k: v for k, v in self.search.items() if k not in ("tree", "samples")} if self.search else None,
        }

    def to_json(self) -> str:
        """The trace as JSON: enums as their strings, every field under its own name."""
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        """A trace from :meth:`to_json`'s text."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trace":
        """A trace from :meth:`to_json`'s content, already parsed."""
        return cls(**{**data, "steps": tuple(StepRecord(**s) for s in data["steps"])})

    @classmethod
    def chained(cls, question: str, traces: list["Trace"], seconds: float, error: str | None = None) -> "Trace":
        """An agent task's traces, one per model turn, as one trace: their steps in order,
        counters summed, the last turn's answer and stop; ``seconds``: the whole task's, tools
        included. Example: turns of 3 steps (a call), 2 steps (a call) and 4 steps (the
        answer) chain into 9 steps whose text ends with the answer."""
        spec: dict[str, SpecDecodingStats] = {}
        for t in traces:
            for role, d in t.spec_decoding.items():
                spec.setdefault(role, SpecDecodingStats()).observe(SpecDecodingStats(
                    d.get("num_spec_tokens", 0), d.get("num_drafts", 0), d.get("num_draft_tokens", 0),
                    d.get("num_accepted_tokens", 0), list(d.get("num_accepted_tokens_per_pos", []))))
        last = traces[-1] if traces else None
        return cls(question=question, strategy=last.strategy if last else "", answer=last.answer if last else None,
                   steps=tuple(s for t in traces for s in t.steps),
                   stop_reason=last.stop_reason if last else StopReason.ERROR, seconds=seconds,
                   spec_decoding={role: s.to_dict() for role, s in spec.items()},
                   num_generate_calls=summed([t.num_generate_calls for t in traces]),
                   num_generated_tokens=summed([t.num_generated_tokens for t in traces]),
                   num_judge_calls=sum(t.num_judge_calls for t in traces),
                   model_seconds=sum(t.model_seconds for t in traces),
                   error=error or next((t.error for t in reversed(traces) if t.error), None),
                   delimiter=last.delimiter if last else "\n\n")


def join_steps(steps, delimiter: str = "\n\n") -> str:
    """The trace text: complete steps joined by the delimiter; a step cut by the
    token cap runs straight on into the next piece."""
    out = ""
    for i, s in enumerate(steps):
        out += s.text
        if i < len(steps) - 1 and s.complete:
            out += delimiter
    return out
