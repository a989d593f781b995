"""One request's turn: what its trace continues, and how the trace's end reads as a reply.

A request without tools continues its question (the reasoning chat, or a conversation);
its reply is the steps as ``reasoning_content`` and the last step as ``content``.

A request with tools renders them with the model's own chat template; a step that
holds a call ends the trace (:class:`stepspec.workflows.agents.toolcalls.ToolCalling`). That
step is read by the served parser (``--tool-call-parser``) into ``tool_calls`` with
``finish_reason: "tool_calls"``; the text before the call in that step is ``content``,
the steps before it ``reasoning_content``. A drafted step whose call is invalid was
already rejected and written by the target (:meth:`stepspec.orchestrator.run.TraceRun.judge`);
a call the target itself wrote invalid is not returned as a call: the reply holds the
step as ``content``, ``finish_reason: "stop"``, and ``stepspec.tool_call_problems`` says
what is wrong with it. ``tool_choice`` "required" or a named function: the whole trace
is the call (its opening is prefilled), as vLLM's server answers such a request.

Worked example: tools ``[multiply]``, the trace "I multiply the two numbers." then
"```json\\n{"name": "multiply", "arguments": {"a": 12, "b": 13}}\\n```" (stop reason
``action``): ``reasoning_content`` "I multiply the two numbers.\\n\\n", no content, one
call to multiply with ``{"a": 12, "b": 13}``, finish_reason "tool_calls".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stepspec.common.states import Author
from stepspec.orchestrator.prompts import Chat, RawPrompt, reasoning_messages
from stepspec.orchestrator.reasoner import Reasoner
from stepspec.orchestrator.stepgen import opening_prompt
from stepspec.orchestrator.steps import StepRules
from stepspec.orchestrator.trace import StopReason, Trace
from stepspec.workflows.agents.toolcalls import Call, ToolCallError, ToolCalling
from stepspec.workflows.serve.protocol import RequestError, TraceRequest

# Stop reasons that end a trace by its own text; the others are a budget's (finish_reason "length").
STOPPED = {StopReason.ANSWER, StopReason.EOS, StopReason.ACTION, StopReason.REPETITION}


@dataclass(frozen=True)
class ChatTurn:
    """What a request's trace continues (``question``), its step rules, and its tool calling
    (None: a request without tools)."""

    question: str
    rules: StepRules
    calling: ToolCalling | None = None

    @classmethod
    def of(cls, request: TraceRequest, reasoner: Reasoner, parser: str, constrained: bool | None = None,
           guidance: bool = False) -> "ChatTurn":
        if request.tools is None:
            return cls(request.question, reasoner.rules)
        try:
            calling = ToolCalling(request.tools.tools, parser, tokenizer=writer(reasoner).tokenizer,
                                  choice=request.tools.choice, parallel=request.tools.parallel, constrained=constrained,
                                  guidance=guidance)
        except ToolCallError as e:
            raise RequestError(400, str(e), "tools") from None
        chat = request.question
        assert isinstance(chat, Chat)  # the protocol makes a Chat of every request with tools
        question = Chat(str(chat), calling.guided(chat.messages), calling.rendered_tools, calling.prefill)
        return cls(question, calling.rules(reasoner.rules), calling)

    @property
    def streams_reasoning(self) -> bool:
        """Whether steps stream as reasoning before the end (not when the whole trace is a forced call)."""
        return self.calling is None or not self.calling.forced

    def holds_call(self, text: str) -> bool:
        """Whether a step's ``text`` holds a tool call: it and the steps after it are the turn's
        calls, never streamed as reasoning."""
        return self.calling is not None and self.calling.holds_call(text)

    async def measured(self, reasoner: Reasoner, max_tokens: int | None) -> tuple["ChatTurn", int]:
        """(this turn, its question carrying the rendered prompt so that the trace does not render
        it again; the prompt's tokens); a 400 when the prompt, or ``max_tokens`` more, would not fit
        the context of the model that writes (:func:`writer`)."""
        engine = writer(reasoner)
        question = self.question
        if not isinstance(question, (Chat, RawPrompt)):  # the same prompt, as a chat that carries its rendering
            question = Chat(question, reasoning_messages(question))
        opening = await opening_prompt(engine, question)
        n = await engine.acount_tokens(opening)
        limit = engine.info.max_model_len
        if limit is not None and n >= limit:
            raise RequestError(400, f"the prompt takes {n} tokens, and this model's context is {limit}; send a "
                                    "shorter conversation (or serve with a larger --max-model-len)", "messages")
        if max_tokens is not None and limit is not None and n + max_tokens > limit:
            raise RequestError(400, f"max_tokens={max_tokens} does not fit: this model's context is {limit} tokens "
                                    f"and the prompt takes {n}, so at most {max(limit - n, 0)} can be asked",
                               "max_tokens")
        question = question.with_opening(engine.info.model, opening) if isinstance(question, Chat) else question
        return replace(self, question=question), n

    def reply(self, trace: Trace, stop: tuple[str, ...]) -> "Reply":
        """How ``trace``'s end reads: reasoning, content, calls (or why they are invalid)."""
        calling = self.calling
        if calling is None or not (calling.forced or trace.stop_reason is StopReason.ACTION):  # (none: no call ends it)
            reasoning, answer = reasoning_and_answer(trace)
            return Reply(reasoning, cut_at_stop(answer, stop), finish_reason=finish_reason(trace))
        before, answer = calling.apart(trace)  # a forced call: the whole trace
        reasoning = before + (trace.delimiter if before else "")
        parsed = calling.parse(answer)  # read and checked once
        why = calling.why_invalid(parsed)
        if why is None:
            return Reply(reasoning, parsed.content, parsed.calls, finish_reason="tool_calls")
        return Reply(reasoning, answer, problems=parsed.problems or (why,), finish_reason=finish_reason(trace))


@dataclass(frozen=True)
class Reply:
    """A trace's end as the reply says it."""

    reasoning: str
    content: str | None
    calls: tuple[Call, ...] = ()
    problems: tuple[str, ...] = ()  # why the call the trace ends with is not returned as one
    finish_reason: str = "stop"

    def stats(self, stats: dict) -> dict:
        """The trace's stats, with the problems of an invalid call."""
        return {**stats, "tool_call_problems": list(self.problems)} if self.problems else stats


def writer(reasoner: Reasoner):
    """The engine whose tokenizer and context a request is measured by: the target, or the
    draft for a strategy that never asks the target (``draft-only``: the target is not started)."""
    in_use = reasoner.engines_in_use()
    return in_use.get(Author.TARGET) or in_use[Author.DRAFT]


def finish_reason(trace: Trace) -> str:
    return "stop" if trace.stop_reason in STOPPED else "length"


def reasoning_and_answer(trace: Trace) -> tuple[str, str]:
    """(the reasoning: every step before the last, each with its delimiter; the last step)."""
    before, last = trace.last_step_apart()
    return before + (trace.delimiter if before else ""), last


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """``text`` up to the first of the stop strings (OpenAI's ``stop``)."""
    cuts = [text.index(s) for s in stop if s and s in text]
    return text[:min(cuts)] if cuts else text
