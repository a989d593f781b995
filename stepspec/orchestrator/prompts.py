"""Prompt text shared by strategies and judges (judges reuse the reasoning prefix
so that their one-token calls hit the target's prefix cache).

A question is plain text (the reasoning chat wraps it: :func:`reasoning_messages`), a
:class:`Chat` (a whole conversation, with the tools its template renders), or a
:class:`RawPrompt` (text continued as given, no template: ``/v1/completions``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

REASONING_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
# Roles a conversation's last message may have: the trace is the assistant's next turn.
ANSWERABLE_ROLES = ("user", "tool")


class Chat(str):
    """A question that brings its own chat: the text is the task, ``messages`` the
    whole conversation a trace continues (an agent's system prompt, the task, its
    earlier thoughts and calls, the tools' results). Every strategy takes it where it
    takes a question; the trace's steps continue a new assistant turn after it.

    ``messages`` are OpenAI's chat messages as the template reads them: ``role`` and
    ``content``, an assistant's ``tool_calls`` (``arguments`` as an object), a tool
    result's ``tool_call_id``. ``tools``: OpenAI function schemas the template renders
    (``{"type": "function", "function": {"name", "description", "parameters"}}``).
    ``prefill``: text the assistant's turn starts with (the opening of a call the
    request forces); the trace continues after it and does not hold it.

    Worked example: ``Chat("What is 12 * 13?", [{"role": "user", "content": "What is
    12 * 13?"}], tools=[multiply_schema])`` renders the template with the multiply tool;
    a trace of it may end in a step holding the call.
    """

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]
    prefill: str
    openings: Mapping[str, str]  # by an engine's model: its template's rendering, already made (with_opening)

    def __new__(cls, text: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = (),
                prefill: str = "", openings: Mapping[str, str] | None = None) -> "Chat":
        chat = super().__new__(cls, text)
        chat.messages = tuple(json.loads(json.dumps(dict(m))) for m in messages)  # a deep, JSON-able copy
        chat.tools = tuple(json.loads(json.dumps(dict(t))) for t in tools)
        chat.prefill = prefill
        chat.openings = dict(openings or {})
        if not chat.messages or chat.messages[-1].get("role") not in ANSWERABLE_ROLES:
            raise ValueError("a Chat ends with a user message (or a tool's result): the trace is the assistant's "
                             "answer to it")
        return chat

    def with_opening(self, model: str, opening: str) -> "Chat":
        """This chat, carrying the rendering of it by ``model``'s template (its text up to the
        assistant's turn, the prefill included): a trace's engines of that model start from it
        instead of rendering it again (a server measured the prompt with it)."""
        return Chat(str(self), self.messages, self.tools, self.prefill, {**self.openings, model: opening})

    def __reduce__(self):  # copy and pickle keep the messages
        return Chat, (str(self), list(self.messages), list(self.tools), self.prefill, dict(self.openings))


class RawPrompt(str):
    """A prompt continued exactly as given: no chat template wraps it (``/v1/completions``,
    for a harness that formats its own prompt)."""


def reasoning_messages(question: str, system_prompt: str = REASONING_SYSTEM_PROMPT) -> list[dict[str, Any]]:
    """The chat that opens every reasoning trace; steps continue the assistant turn.
    A :class:`Chat` is its own opening."""
    if isinstance(question, Chat):
        return [dict(m) for m in question.messages]
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": str(question)}]


def question_tools(question: str) -> list[dict[str, Any]] | None:
    """The tools a question's template renders (a :class:`Chat`'s), or None."""
    return [dict(t) for t in question.tools] if isinstance(question, Chat) and question.tools else None


def answers_tool_result(question: str) -> bool:
    """Whether the trace is an agent's turn after a tool's result (a :class:`Chat` whose last
    message is the tool's): the turn that decides between another call and the answer."""
    return isinstance(question, Chat) and question.messages[-1].get("role") == "tool"


def message_text(message: Mapping[str, Any]) -> str:
    """A chat message as text: its content, then its tool calls as their JSON."""
    calls = [json.dumps(c.get("function", c)) for c in message.get("tool_calls") or ()]
    return "\n".join([message.get("content") or "", *calls]).strip() if calls else message.get("content") or ""


def opening_messages(question: str, system_prompt: str = REASONING_SYSTEM_PROMPT) -> tuple[tuple[str, str], ...]:
    """The same chat as (role, content) pairs, as judges receive it in a StepCandidate."""
    return tuple((m["role"], message_text(m)) for m in reasoning_messages(question, system_prompt))
