"""``stepspec serve``: speculative reasoning behind an OpenAI-compatible endpoint.

Any client of the OpenAI API (the openai SDK, LangChain, DSPy, lm-eval's API models,
curl) gets a reasoning trace per request:

* ``POST /v1/chat/completions`` (streaming or not): the steps as ``reasoning_content``,
  the answer step as ``content``, the way vLLM's reasoning parsers split a reply. A step
  is streamed once it is final (a drafted step after its judge, a cut step's pieces as
  they join the trace), so nothing streamed is taken back; the last step is held until
  the trace ends, since only then is it known to be the answer.
* ``POST /v1/completions``: the trace's whole text as ``text``.
* ``GET /v1/models``: the served reasoners, by name; ``GET /health``.

Every response carries ``usage`` and a ``stepspec`` object: the trace's stats (steps,
drafted steps kept and cut, the target's token share, times, token-level acceptance).
All requests to a model share its reasoner, so concurrent traces batch in the engines and
the goodput governor sees their load. A client that disconnects cancels its trace, which
aborts its engine requests. Each trace's engine calls carry a session id
(:mod:`stepspec.engine.session`): behind a prefix-aware router a trace stays on one replica.

Worked example::

    stepspec serve                # the bundled pair, specreason, on 127.0.0.1:8000

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    for chunk in client.chat.completions.create(model="stepspec", stream=True,
            messages=[{"role": "user", "content": "What is 12 * 13?"}]):
        print(chunk.choices[0].delta)  # reasoning_content deltas, then the content
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections import OrderedDict
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from openai.types import Completion, CompletionChoice, CompletionUsage, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall, ChoiceDeltaToolCallFunction

from stepspec.common.names import did_you_mean
from stepspec.engine.session import TRACE_SESSION
from stepspec.orchestrator.budget import Budget
from stepspec.orchestrator.goodput import GoodputGovernor
from stepspec.orchestrator.reasoner import Reasoner, Solution
from stepspec.orchestrator.run import ReasoningError
from stepspec.orchestrator.strategies import STRATEGIES
from stepspec.orchestrator.trace import StepRecord, Trace, join_steps
from stepspec.orchestrator.verify_queue import JudgeQueue
from stepspec.workflows.agents.toolcalls import check_bindable, parser_class
from stepspec.workflows.serve.protocol import RequestError, TraceRequest, parse_chat, parse_completion, parse_json
from stepspec.workflows.serve.settings import ServeSettings
from stepspec.workflows.serve.turns import ChatTurn, cut_at_stop, finish_reason

logger = logging.getLogger(__name__)
ARGUMENT_PIECE = 16  # characters of a call's arguments per streamed delta


class HeldStep:
    """Streams a trace's records as they join it, one step behind: a step goes out (with
    its delimiter) once the next one begins; the last one is the answer."""

    def __init__(self, delimiter: str) -> None:
        self.delimiter, self.held = delimiter, []

    def push(self, record: StepRecord) -> str | None:
        out = None
        if self.held and self.held[-1].complete:
            out, self.held = join_steps(self.held, self.delimiter) + self.delimiter, []
        self.held.append(record)
        return out


class Served:
    """The served reasoners by model name, the traces in flight, and the reasoners that
    requests with their own ``stepspec`` settings run on (the same engines; kept for
    the next request asking the same, with a governor per strategy)."""

    def __init__(self, reasoners: Mapping[str, Reasoner], settings: ServeSettings,
                 on_trace: Callable[[Trace], None] | None = None) -> None:
        if not reasoners:
            raise ValueError("nothing to serve: give at least one reasoner")
        self.reasoners, self.settings, self.on_trace = dict(reasoners), settings, on_trace
        for reasoner in self.reasoners.values():
            # A reply runs to max_tokens whatever separates its steps (a call's JSON, code): the
            # check that the delimiter ever appears guards a reasoning setup, not a client's reply.
            reasoner.budget = reasoner.budget.model_copy(update={"max_cut_steps": None})
        self.in_flight = 0
        self.variants: OrderedDict[str, Reasoner] = OrderedDict()
        self.governors: dict[tuple[str, str], GoodputGovernor] = {
            (name, r.strategy.name): r.governor for name, r in self.reasoners.items() if r.governor is not None}
        self.created = int(time.time())

    def model(self, name: str | None) -> tuple[str, Reasoner]:
        if name is None or name == "":
            if len(self.reasoners) == 1:
                return next(iter(self.reasoners.items()))
            raise RequestError(400, f"'model' is required: this server serves {', '.join(self.reasoners)}", "model")
        if name not in self.reasoners:
            raise RequestError(404, f"model '{name}' is not served here{did_you_mean(name, self.reasoners)} "
                                    f"(served: {', '.join(self.reasoners)}; GET /v1/models lists them)",
                               "model", kind="not_found_error")
        return name, self.reasoners[name]

    def reasoner_for(self, name: str, base: Reasoner, request: TraceRequest) -> Reasoner:
        """The reasoner of this request: the served one, or one with the request's settings
        on the same engines."""
        ext = request.extension
        strategy = ext.strategy or base.strategy.name
        same = strategy == base.strategy.name
        options = {**(base.options if same else {}), **ext.options}
        fields = _strategy_option_names(strategy)
        for key, value in request.sampling.items():
            if key in fields:
                options[key] = value
            elif key == "temperature" and value != 0:
                raise RequestError(400, f"temperature={value}: strategy '{strategy}' decodes greedily; send 0 or "
                                        "leave it out (tree and best-of-n sample: their temperature option)",
                                   "temperature")
        budget = dict(ext.budget)
        if request.max_tokens is not None:
            budget["max_tokens"] = request.max_tokens
        if same and not ext.judge and not ext.judge_options and not budget and options == base.options:
            return base
        key = json.dumps([name, strategy, options, ext.judge, ext.judge_options, budget], sort_keys=True, default=str)
        if key in self.variants:
            self.variants.move_to_end(key)
            return self.variants[key]
        try:
            merged = Budget(**{**base.budget.model_dump(), **budget})
            own_judge = bool(ext.judge or ext.judge_options or not same)
            shared = base.judge.inner if isinstance(base.judge, JudgeQueue) else base.judge
            reasoner = Reasoner(base.target, base.draft, strategy=strategy, judge=ext.judge if own_judge else shared,
                                judge_options=ext.judge_options or None,
                                router=base.router if _needs_router(strategy) else None,
                                rules=base.rules, budget=merged, max_concurrency=base.max_concurrency, **options)
        except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
            raise RequestError(400, f"stepspec: {e}", "stepspec") from None
        if not own_judge:
            reasoner.judge = base.judge  # the served reasoner's judge (its queue batches every request's steps)
        if reasoner.governor is not None:  # one governor per served model and strategy: it sees their load
            reasoner.governor = self.governors.setdefault((name, strategy), reasoner.governor)
        self.variants[key] = reasoner
        while len(self.variants) > 32:
            self.variants.popitem(last=False)
        return reasoner

    def admit(self) -> None:
        if self.in_flight >= self.settings.max_concurrency:
            raise RequestError(429, f"{self.in_flight} traces in flight, the server's --max-concurrency; retry after "
                                    f"{self.settings.retry_after_s} s", kind="rate_limit_error",
                               headers={"Retry-After": str(self.settings.retry_after_s)})
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1


def _strategy_option_names(strategy: str) -> set[str]:
    known = STRATEGIES.get(strategy)
    return set(known.options) if known else set()


def _needs_router(strategy: str) -> bool:
    known = STRATEGIES.get(strategy)
    return known is not None and known.needs_router


async def _solve(served: Served, reasoner: Reasoner, turn: ChatTurn, session: str,
                 on_step: Callable[[StepRecord], None] | None = None) -> Solution:
    TRACE_SESSION.set(session)  # this task's own context: every engine call of the trace carries it
    try:
        solution = await reasoner.asolve(turn.question, on_step, rules=turn.rules)
    except ReasoningError as e:
        if served.on_trace is not None:
            served.on_trace(e.trace)
        raise
    if served.on_trace is not None:
        served.on_trace(solution.trace)
    return solution


def _usage(prompt_tokens: int, trace: Trace) -> CompletionUsage:
    return CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=trace.num_tokens,
                           total_tokens=prompt_tokens + trace.num_tokens)


def _trace_failed(e: ReasoningError) -> RequestError:
    return RequestError(502, f"the trace failed after {len(e.trace.steps)} steps: {e}", kind="server_error")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the request body is {declared} bytes, over this server's limit of {limit} "
                                "(--max-body-bytes)", kind="invalid_request_error")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, f"the request body is over this server's limit of {limit} bytes "
                                    "(--max-body-bytes)")
    return body


def build_app(reasoners: Mapping[str, Reasoner], settings: ServeSettings = ServeSettings(),
              close: Callable[[], Awaitable[None]] | None = None,
              on_trace: Callable[[Trace], None] | None = None) -> FastAPI:
    """The FastAPI app serving ``reasoners`` (by model name). Its lifespan starts their
    engines (requests are served once they are up) and closes them at shutdown, then
    calls ``close`` (what owns engines the reasoners share: a workflow's). ``on_trace``
    hears each request's trace as it ends, a failed one's too (an agent bench reads them)."""
    served = Served(reasoners, settings, on_trace)
    api_key = settings.api_key()
    parser_class(settings.tool_call_parser)  # an unknown parser fails here, before any engine starts
    if settings.constrained_calls:
        check_bindable(settings.tool_call_parser)

    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for reasoner in served.reasoners.values():
            await reasoner.start()
        try:
            yield
        finally:
            for reasoner in served.reasoners.values():
                await reasoner.aclose()
            if close is not None:
                await close()

    app = FastAPI(title="stepspec", lifespan=lifespan)
    app.state.served = served

    @app.exception_handler(RequestError)
    async def refused(request: Request, e: RequestError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception) -> JSONResponse:
        logger.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse(RequestError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error").body(),
                            status_code=500)

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise RequestError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' with the key in "
                                    "the server's --api-key-env variable", kind="authentication_error")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "in_flight": served.in_flight}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        return {"object": "list", "data": [
            Model(id=name, created=served.created, object="model", owned_by="stepspec").model_dump()
            for name in served.reasoners]}

    async def checked(request: Request, parse: Callable[[dict], TraceRequest]) -> tuple[str, Reasoner, TraceRequest]:
        authorize(request)
        body = parse_json(await _read_body(request, settings.max_body_bytes))
        trace_request = parse(body)
        name, base = served.model(trace_request.model)
        return name, served.reasoner_for(name, base, trace_request), trace_request

    async def answer(request: Request, parse: Callable[[dict], TraceRequest], prefix: str, chunks, reply) -> Response:
        """One endpoint's request: checked, then streamed as ``chunks`` renders it, or solved
        and answered with ``reply(name, rid, request, turn, solution, usage)``."""
        name, reasoner, tr = await checked(request, parse)
        turn = ChatTurn.of(tr, reasoner, settings.tool_call_parser, settings.constrained_calls, settings.call_guidance)
        turn, prompt_tokens = await turn.measured(reasoner, tr.max_tokens)  # the prompt rendered once
        rid = f"{prefix}-{uuid.uuid4().hex}"
        if tr.stream:
            return _streamed(served, request, reasoner, turn, rid,
                             chunks(name, rid, tr, turn, reasoner.rules.delimiter, prompt_tokens))
        solution = await _solved(served, request, reasoner, turn, rid)
        body = reply(name, rid, tr, turn, solution, _usage(prompt_tokens, solution.trace))
        return JSONResponse(body.model_dump(mode="json", exclude_none=True))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, parse_chat, "chatcmpl", _chat_chunks, _chat_reply)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(request, parse_completion, "cmpl", _completion_chunks, _completion_reply)

    return app


def _chat_reply(name: str, rid: str, tr: TraceRequest, turn: ChatTurn, solution: Solution,
                usage: CompletionUsage) -> ChatCompletion:
    said = turn.reply(solution.trace, tr.stop)
    message = ChatCompletionMessage(role="assistant", content=said.content, reasoning_content=said.reasoning,
                                    tool_calls=[c.openai() for c in said.calls] or None)
    return ChatCompletion(id=rid, object="chat.completion", created=int(time.time()), model=name,
                          choices=[Choice(index=0, message=message, finish_reason=said.finish_reason)],
                          usage=usage, stepspec=said.stats(solution.stats))


def _completion_reply(name: str, rid: str, tr: TraceRequest, turn: ChatTurn, solution: Solution,
                      usage: CompletionUsage) -> Completion:
    trace = solution.trace
    choice = CompletionChoice(index=0, text=cut_at_stop(trace.text, tr.stop), finish_reason=finish_reason(trace))
    return Completion(id=rid, object="text_completion", created=int(time.time()), model=name, choices=[choice],
                      usage=usage, stepspec=solution.stats)


async def _solved(served: Served, request: Request, reasoner: Reasoner, turn: ChatTurn, rid: str) -> Solution:
    """Solve, watching the client: one that disconnects cancels the trace (and its engine
    requests)."""
    served.admit()
    task = asyncio.ensure_future(_solve(served, reasoner, turn, rid))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=served.settings.disconnect_poll_s)
            if done:
                break
            if await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                logger.info("%s: the client disconnected; its trace was cancelled", rid)
                raise RequestError(499, "the client closed the request")
        try:
            solution = task.result()
        except ReasoningError as e:
            raise _trace_failed(e) from None
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        served.release()
    return solution


_DONE = object()


def _streamed(served: Served, request: Request, reasoner: Reasoner, turn: ChatTurn, rid: str,
              render: Callable[[AsyncIterator[StepRecord], asyncio.Task], AsyncIterator[str]]) -> StreamingResponse:
    """An SSE response: ``render`` turns the trace's records (from a queue) into events.
    The trace runs as a task; a client that goes away cancels the stream, which cancels it."""
    served.admit()
    queue: asyncio.Queue = asyncio.Queue()
    task = asyncio.ensure_future(_solve(served, reasoner, turn, rid, queue.put_nowait))
    task.add_done_callback(lambda _: (served.release(), queue.put_nowait(_DONE)))

    async def events() -> AsyncIterator[str]:
        try:
            async for event in render(_records(queue, request, served.settings.disconnect_poll_s), task):
                yield event
        except ClientGone:
            pass
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                logger.info("%s: the stream ended before the trace; the trace was cancelled", rid)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse(data: Any) -> str:
    payload = data.model_dump(mode="json", exclude_none=True) if hasattr(data, "model_dump") else data
    return f"data: {json.dumps(payload)}\n\n"


class ClientGone(Exception):
    """The client of a stream went away before the trace ended."""


async def _records(queue: asyncio.Queue, request: Request, poll_s: float) -> AsyncIterator[StepRecord]:
    """The trace's records as they join it, until it ends; raises :class:`ClientGone` as
    soon as the client disconnects (the stream's end then cancels the trace)."""
    while True:
        try:
            item = await asyncio.wait_for(queue.get(), timeout=poll_s)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                raise ClientGone from None
            continue
        if item is _DONE:
            return
        yield item


def _error_event(e: Exception) -> str:
    """A failed trace, as the stream's last events (the SDK raises it as an APIError)."""
    if isinstance(e, ReasoningError):
        error = _trace_failed(e)
    else:
        logger.error("a streamed trace failed: %s: %s", type(e).__name__, e, exc_info=e)
        error = RequestError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")
    return _sse(error.body()) + "data: [DONE]\n\n"


def _chat_chunks(name: str, rid: str, tr: TraceRequest, turn: ChatTurn, delimiter: str, prompt_tokens: int):
    created = int(time.time())

    def chunk(delta: ChoiceDelta, finish: str | None = None, **extra: Any) -> str:
        return _sse(ChatCompletionChunk(id=rid, object="chat.completion.chunk", created=created, model=name,
                                        choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)], **extra))

    async def render(records: AsyncIterator[StepRecord], task: asyncio.Task) -> AsyncIterator[str]:
        yield chunk(ChoiceDelta(role="assistant", content=""))
        held, calls_begun = HeldStep(delimiter), False
        async for record in records:
            if (text := held.push(record)) is not None and turn.streams_reasoning and not calls_begun:
                calls_begun = turn.holds_call(text)  # the turn's calls go out as tool_calls at the end
                if not calls_begun:
                    yield chunk(ChoiceDelta(reasoning_content=text))
        try:
            solution = task.result()
        except Exception as e:
            yield _error_event(e)
            return
        trace = solution.trace
        said = turn.reply(trace, tr.stop)
        if said.content:
            yield chunk(ChoiceDelta(content=said.content))
        for i, call in enumerate(said.calls):  # OpenAI's deltas: index, id and name, then the arguments in pieces
            yield chunk(ChoiceDelta(tool_calls=[ChoiceDeltaToolCall(
                index=i, id=call.id, type="function", function=ChoiceDeltaToolCallFunction(name=call.name,
                                                                                           arguments=""))]))
            arguments = call.openai()["function"]["arguments"]
            for k in range(0, len(arguments), ARGUMENT_PIECE):
                yield chunk(ChoiceDelta(tool_calls=[ChoiceDeltaToolCall(
                    index=i, function=ChoiceDeltaToolCallFunction(arguments=arguments[k:k + ARGUMENT_PIECE]))]))
        yield chunk(ChoiceDelta(), said.finish_reason, stepspec=said.stats(solution.stats))
        if tr.include_usage:
            yield _sse(ChatCompletionChunk(id=rid, object="chat.completion.chunk", created=created, model=name,
                                           choices=[], usage=_usage(prompt_tokens, trace)))
        yield "data: [DONE]\n\n"

    return render


def _completion_chunks(name: str, rid: str, tr: TraceRequest, turn: ChatTurn, delimiter: str, prompt_tokens: int):
    created = int(time.time())

    def chunk(text: str, finish: str | None = None, **extra: Any) -> str:
        # a chunk's finish_reason is null until the last: built as the SDK builds what it reads
        choice = CompletionChoice.model_construct(index=0, text=text, finish_reason=finish, logprobs=None)
        return _sse(Completion.model_construct(id=rid, object="text_completion", created=created, model=name,
                                               choices=[choice], **extra))

    async def render(records: AsyncIterator[StepRecord], task: asyncio.Task) -> AsyncIterator[str]:
        written, sent, after = "", "", ""  # the trace's text so far, what went out, the delimiter owed
        async for record in records:
            written += after + record.text
            after = delimiter if record.complete else ""
            cut = cut_at_stop(written, tr.stop)
            if piece := cut[len(sent):]:
                sent = cut
                yield chunk(piece)
        try:
            solution = task.result()
        except Exception as e:
            yield _error_event(e)
            return
        trace = solution.trace
        usage = _usage(prompt_tokens, trace) if tr.include_usage else None
        yield chunk("", finish_reason(trace), stepspec=solution.stats, usage=usage)
        yield "data: [DONE]\n\n"

    return render
