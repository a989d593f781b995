"""Prompt text shared by strategies and judges (judges reuse the reasoning prefix
so that their one-token calls hit the target's prefix cache)."""

REASONING_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def reasoning_messages(question: str, system_prompt: str = REASONING_SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The chat that opens every reasoning trace; steps continue the assistant turn."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def opening_messages(question: str, system_prompt: str = REASONING_SYSTEM_PROMPT) -> tuple[tuple[str, str], ...]:
    """The same chat as (role, content) pairs, as judges receive it in a StepCandidate."""
    return tuple((m["role"], m["content"]) for m in reasoning_messages(question, system_prompt))
