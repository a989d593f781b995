"""Prompt text shared by strategies and judges (judges reuse the reasoning prefix
so that their one-token calls hit the target's prefix cache)."""

from __future__ import annotations

from typing import Mapping, Sequence

REASONING_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


class Chat(str):
    """A question that brings its own chat: the text is the task, ``messages`` the
    whole conversation a trace continues (an agent's system prompt, the task, its
    earlier thoughts and the tools' observations). Every strategy takes it where it
    takes a question; the trace's steps continue a new assistant turn after it."""

    messages: tuple[tuple[str, str], ...]

    def __new__(cls, text: str, messages: Sequence[Mapping[str, str]]) -> "Chat":
        chat = super().__new__(cls, text)
        chat.messages = tuple((m["role"], m["content"]) for m in messages)
        if not chat.messages or chat.messages[-1][0] != "user":
            raise ValueError("a Chat ends with a user message: the trace is the assistant's answer to it")
        return chat

    def __reduce__(self):  # copy and pickle keep the messages
        return Chat, (str(self), [{"role": r, "content": c} for r, c in self.messages])


def reasoning_messages(question: str, system_prompt: str = REASONING_SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The chat that opens every reasoning trace; steps continue the assistant turn.
    A :class:`Chat` is its own opening."""
    if isinstance(question, Chat):
        return [{"role": role, "content": content} for role, content in question.messages]
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def opening_messages(question: str, system_prompt: str = REASONING_SYSTEM_PROMPT) -> tuple[tuple[str, str], ...]:
    """The same chat as (role, content) pairs, as judges receive it in a StepCandidate."""
    return tuple((m["role"], m["content"]) for m in reasoning_messages(question, system_prompt))
