"""The HTTP side of :class:`stepspec.engine.openai_backend.OpenAIEngine`: one request path, retried
by tenacity, and the errors it words (the backend's module docstring says which failures
are retried and how). :class:`ServerConnection` holds the engine's methods for it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

import httpx
import tenacity

from stepspec.common.names import did_you_mean
from stepspec.engine.protocol import EngineError, EngineUnavailableError
from stepspec.engine.session import TRACE_SESSION
from stepspec.engine.stats import SpecDecodingStats

logger = logging.getLogger("stepspec.engine.openai_backend")

TOKEN_ID_PREFIX = "token_id:"
REPLACEMENT_CHAR = "\ufffd"
# Connection-level failures: the request did not (fully) reach the server, or the server
# dropped the connection before answering (it died mid-request: a reset is a ReadError or
# WriteError, a close a RemoteProtocolError). A retry reaches a restarted server, or finds
# the port closed (ConnectError) and reports the server unavailable.
RETRYABLE_TRANSPORT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError,
                               httpx.ReadError, httpx.WriteError)
MAX_BACKOFF_S = 30.0


def retryable_status(status: int) -> bool:
    return status == 429 or status >= 500


class ServerHTTPError(EngineError):
    """The server answered with an error status (after retries, for 429 and 5xx).

    ``status`` is the HTTP status, ``server_message`` the error message from its body.
    """

    def __init__(self, message: str, *, status: int, server_message: str) -> None:
        super().__init__(message)
        self.status = status
        self.server_message = server_message


class RetryableStatus(Exception):
    """A 429 or 5xx answer: retried while attempts are left."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def model_cards(resp: httpx.Response) -> dict[str, dict[str, Any]]:
    """The model cards of a ``/v1/models`` answer, by served name."""
    return {str(c.get("id")): c for c in resp.json().get("data") or []}


def request_spec_stats(body: Mapping[str, Any]) -> SpecDecodingStats | None:
    """A completion's per-request ``metrics.speculative_decoding`` (vLLM) as
    :class:`SpecDecodingStats`; None when the server sent none."""
    spec = (body.get("metrics") or {}).get("speculative_decoding")
    if not spec:
        return None
    return SpecDecodingStats.from_histogram(int(spec["num_spec_tokens"]), spec["acceptance_histogram"],
                                            int(spec["num_draft_tokens"]))


def server_message(resp: httpx.Response) -> str:
    """The error message in a server's error body (vLLM, SGLang, FastAPI shapes)."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:1000] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])
    return str(body)[:1000]


def normalize_base_url(base_url: str) -> str:
    """``http://host:port`` with no trailing ``/`` or ``/v1``: the server root."""
    url = base_url.strip().rstrip("/").removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        raise EngineError(f"base_url {base_url!r} is not an http(s) URL; pass e.g. 'http://127.0.0.1:8000'")
    return url


async def gather_or_cancel(aws: Sequence[Awaitable[Any]]) -> list[Any]:
    """``asyncio.gather``, but the first failure cancels the rest before it propagates."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        # Wait for the cancellations; the first exception is re-raised below.
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class ServerConnection:
    """The request path and error wording of :class:`stepspec.engine.openai_backend.OpenAIEngine`
    (which sets the attributes these methods read: ``base_url``, ``name``, ``model``,
    ``max_retries``, ``retry_backoff_s``, ``max_concurrency``, ``session_header`` and the
    client state)."""

    # -- HTTP ----------------------------------------------------------------------

    def _async_client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            if self._client is not None:
                # The old client's connections belong to a loop that is gone; they
                # cannot be closed from here and are dropped with it.
                logger.debug("engine '%s': new HTTP client for a new event loop", self.name)
            limits = httpx.Limits(max_connections=self.max_concurrency,
                                  max_keepalive_connections=self.max_concurrency)
            self._client = httpx.AsyncClient(base_url=self.base_url, headers=self._headers,
                                             timeout=self._timeout, limits=limits)
            self._client_loop = loop
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
        assert self._semaphore is not None
        return self._client, self._semaphore

    def _session_headers(self) -> dict[str, str]:
        """The trace's session header (:mod:`stepspec.engine.session`), when a trace is calling."""
        session = TRACE_SESSION.get()
        return {self.session_header: session} if session and self.session_header else {}

    def _backoff(self, state: tenacity.RetryCallState) -> float:
        """Seconds before the next attempt: ``retry_backoff_s * 2**n`` after the (n+1)-th,
        at least a 429's ``Retry-After``, at most 30."""
        delay = self.retry_backoff_s * 2 ** (state.attempt_number - 1)
        failure = state.outcome.exception() if state.outcome else None
        if isinstance(failure, RetryableStatus) and failure.response.status_code == 429:
            retry_after = failure.response.headers.get("retry-after", "")
            if retry_after.replace(".", "", 1).isdigit():
                delay = max(delay, float(retry_after))
        return min(delay, MAX_BACKOFF_S)

    async def _request(self, method: str, path: str, payload: Any = None) -> httpx.Response:
        """One HTTP call with retries; returns a 2xx response or raises EngineError."""
        client, semaphore = self._async_client()
        since = time.monotonic()
        where = f"engine '{self.name}': request {path} to {self.base_url}"
        try:
            async for attempt in self._retrying.copy():
                with attempt:
                    async with semaphore:
                        resp = await client.request(method, path, json=payload, headers=self._session_headers())
                    if retryable_status(resp.status_code):
                        raise RetryableStatus(resp)
        except RETRYABLE_TRANSPORT_ERRORS as e:
            raise self._unreachable_error(path, e, time.monotonic() - since) from e
        except RetryableStatus as e:
            raise self._http_error(path, e.response) from None
        except httpx.TimeoutException as e:
            raise EngineError(f"{where} timed out after timeout_s={self.timeout_s:g}s ({type(e).__name__}). "
                              "Raise timeout_s, or send fewer or shorter requests (max_tokens), or check that "
                              "the server is not overloaded.") from e
        except httpx.HTTPError as e:
            raise EngineError(f"engine '{self.name}': HTTP request {path} to {self.base_url} failed: "
                              f"{type(e).__name__}: {e}. Check base_url and the server log.") from e
        if resp.status_code >= 400:
            message = server_message(resp)
            if resp.status_code == 404 and self.model in message and "not exist" in message and path != "/v1/models":
                raise self._model_not_served_error(list(model_cards(await self._request("GET", "/v1/models"))))
            raise self._http_error(path, resp)
        return resp

    # -- errors --------------------------------------------------------------------

    def _unreachable_error(self, path: str, e: Exception, seconds: float) -> EngineUnavailableError:
        tried = f"{type(e).__name__}: {str(e) or 'no answer'}; {self.max_retries + 1} attempts on {path} over {seconds:.1f} s"
        if self._started:  # it answered /v1/models at start: it died or was stopped since
            return EngineUnavailableError(
                f"engine '{self.name}': the OpenAI-compatible server at {self.base_url} stopped answering "
                f"during the run (unreachable: {tried}); it answered at start, so it has crashed or been "
                "stopped. Check its log, restart it on the same address, then resume the run "
                "(`stepspec run FILE --resume RECORD` for a workflow)."
            )
        return EngineUnavailableError(
            f"engine '{self.name}': the OpenAI-compatible server at {self.base_url} is not answering "
            f"(unreachable: {tried}). Start the server (e.g. `python -m vllm.entrypoints.openai.api_server "
            "--model ... --port ...`) or fix base_url."
        )

    def _http_error(self, path: str, resp: httpx.Response) -> ServerHTTPError:
        status, message = resp.status_code, server_message(resp)
        where = f"engine '{self.name}': {resp.request.method} {self.base_url}{path} -> HTTP {status}"
        if status == 404:
            text = f"{where}: {message}. This server does not implement {path}" + (
                "; pass tokenizer=<path or HF id> so tokenization runs locally"
                if path in ("/tokenize", "/detokenize") else "; check base_url points at an OpenAI-compatible server")
        elif status in (401, 403):
            text = (f"{where}: the server rejected the API key: {message}. Pass api_key or api_key_env matching "
                    "the server's --api-key.")
        elif retryable_status(status):
            text = (f"{where} after {self.max_retries + 1} attempts: {message}. The server is overloaded or "
                    "failing; check its log, lower the concurrency or raise max_retries.")
        else:
            text = (f"{where}: the server refused the request: {message}. Fix the request (a prompt longer than "
                    "the server's --max-model-len must be shortened; logprobs above --max-logprobs need a server "
                    "started with a larger one).")
        return ServerHTTPError(text, status=status, server_message=message)

    def _model_not_served_error(self, served: list[str]) -> EngineError:
        return EngineError(
            f"engine '{self.name}': model {self.model!r} is not served at {self.base_url}; it serves "
            f"{served}.{did_you_mean(self.model, served)} Set model to a served name (the server's "
            "--served-model-name) or start the server with this model."
        )
