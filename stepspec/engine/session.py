"""The trace a model call belongs to, for routers in front of scaled-out servers.

A trace sends many requests that share a growing prefix (the question, then every
step so far). Behind a prefix-aware router (vLLM's production-stack router with
``--routing-logic session``, llm-d, SGLang's router), requests that carry the same
session header go to the same replica, whose prefix cache holds the trace. The
driver sets :data:`TRACE_SESSION` for each trace (a server sets it per request, the
same for every trace of that request); :class:`stepspec.engine.openai_backend.OpenAIEngine`
sends it in the header its config names (``session_header``, default
:data:`DEFAULT_SESSION_HEADER`). asyncio copies context into tasks, so every call a
trace makes, however deep, carries it.

Worked example: ``TRACE_SESSION.set("a1b2")``; the trace's next three calls to the
target's server each carry ``X-Session-ID: a1b2``.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar

DEFAULT_SESSION_HEADER = "X-Session-ID"
TRACE_SESSION: ContextVar[str | None] = ContextVar("stepspec_trace_session", default=None)


def new_session() -> str:
    return uuid.uuid4().hex
