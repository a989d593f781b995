"""Tests of stepspec.engine.openai_backend.OpenAIEngine.

The first group needs no vLLM server: a dead port, a socket that never answers, and a
small stub HTTP server with canned answers (retries, finish reasons, spec-decode
metrics). The ``server`` group starts a real vLLM OpenAI server on a tiny random model
and checks the HTTP backend against the in-process ``VLLMEngine`` on the same model.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stepspec.engine.openai_backend import OpenAIEngine
from stepspec.engine.protocol import Engine, EngineError
from stepspec.engine.types import (
    ContinuationRequest,
    FinishReason,
    GenerationRequest,
    Sampling,
    ScoredToken,
)
from openai_server import free_port, start_vllm_server, stop_process, wait_healthy
from tiny_models import build_tiny_model

MAX_MODEL_LEN = 1024
SERVED_NAME = "tiny"
PROMPT = "How many clips did Natalia sell"
TOKEN_PROMPT_TEXT = "Let me check: 12 / 60 ="
MAX_TOKENS = 24
TOP_K = 5
# A continuation the tiny model would not write itself (scored after TOKEN_PROMPT_TEXT).
SCORED_TEXT = " 0.2 per minute, 0.2 * 50 = 10."


def _run(coro):
    return asyncio.run(coro)


# -- no server ---------------------------------------------------------------------


def test_dead_server_fails_after_bounded_retries():
    port = free_port()  # nothing listens there
    engine = OpenAIEngine(f"http://127.0.0.1:{port}/v1", "m", max_retries=2, retry_backoff_s=0.01)
    assert isinstance(engine, Engine)

    async def go():
        try:
            await engine.generate([GenerationRequest("hi")])
        finally:
            await engine.close()

    t0 = time.perf_counter()
    with pytest.raises(EngineError) as e:
        _run(go())
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert f"http://127.0.0.1:{port}" in msg
    assert "3 attempts" in msg and "start the server" in msg.lower() and "base_url" in msg
    # The synchronous tokenizer methods never ask the server: unstarted, they say so.
    with pytest.raises(EngineError, match=r"not started; await engine.start\(\) first"):
        engine.count_tokens("hi")


def test_missing_api_key_env(monkeypatch):
    monkeypatch.delenv("STEPSPEC_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(EngineError, match="STEPSPEC_TEST_NO_SUCH_KEY.*not set"):
        OpenAIEngine("http://127.0.0.1:1", "m", api_key_env="STEPSPEC_TEST_NO_SUCH_KEY")
    monkeypatch.setenv("STEPSPEC_TEST_NO_SUCH_KEY", "secret")
    engine = OpenAIEngine("http://127.0.0.1:1", "m", api_key_env="STEPSPEC_TEST_NO_SUCH_KEY")
    assert engine._headers == {"Authorization": "Bearer secret"}


def test_read_timeout_names_the_setting():
    # A listening socket that never accepts: the kernel completes the handshake, the
    # request goes out, no answer ever comes.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        engine = OpenAIEngine(f"http://127.0.0.1:{port}", "m", timeout_s=0.3, retry_backoff_s=0.01)

        async def go():
            try:
                await engine.start()
            finally:
                await engine.close()

        with pytest.raises(EngineError, match=r"request /v1/models to .* timed out after timeout_s=0.3s.*Raise timeout_s"):
            _run(go())


class _Stub(ThreadingHTTPServer):
    """Canned JSON answers keyed by (method, path); counts the hits.

    An answer is ``(status, payload)`` or ``(status, payload, headers)``, or a function of
    the request body returning one.
    """

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _StubHandler)
        self.routes: dict[tuple[str, str], tuple | Callable[[dict], tuple]] = {}
        self.hits: list[tuple[str, str, dict | None]] = []
        self.headers_seen: list[dict[str, str]] = []  # each request's headers
        self.delay_s = 0.0  # how long each answer takes (a slow server)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _StubHandler(BaseHTTPRequestHandler):
    def _answer(self, method: str) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.hits.append((method, self.path, body))
        self.server.headers_seen.append(dict(self.headers))
        time.sleep(self.server.delay_s)
        route = self.server.routes.get((method, self.path), (404, {"detail": "Not Found"}))
        status, payload, *headers = route(body) if callable(route) else route
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in (headers[0] if headers else {}).items():
            self.send_header(name, value)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer("GET")

    def do_POST(self):
        self._answer("POST")

    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture
def stub():
    server = _Stub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.routes[("GET", "/v1/models")] = (200, {"data": [{"id": "m", "max_model_len": 64}]})
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _completion_hits(stub: _Stub) -> list[dict]:
    return [b for m, p, b in stub.hits if p == "/v1/completions"]


def test_5xx_retried_then_error_4xx_not_retried(stub):
    async def go():
        async with OpenAIEngine(stub.url, "m", max_retries=2, retry_backoff_s=0.01) as engine:
            stub.routes[("POST", "/v1/completions")] = (503, {"error": {"message": "busy"}})
            with pytest.raises(EngineError, match=r"HTTP 503 after 3 attempts: busy"):
                await engine.generate([GenerationRequest("hi")])
            assert len(_completion_hits(stub)) == 3

            stub.hits.clear()
            stub.routes[("POST", "/v1/completions")] = (400, {"error": {"message": "bad field"}})
            with pytest.raises(
                EngineError, match=r"HTTP 400: the server refused the request: bad field"
            ):
                await engine.generate([GenerationRequest("hi")])
            assert len(_completion_hits(stub)) == 1

            stub.routes[("POST", "/v1/completions")] = (401, {"error": {"message": "bad key"}})
            with pytest.raises(EngineError, match=r"rejected the API key.*api_key_env"):
                await engine.generate([GenerationRequest("hi")])

            # A 429 waits at least its Retry-After, whatever the backoff.
            stub.hits.clear()
            stub.routes[("POST", "/v1/completions")] = (429, {"error": {"message": "slow down"}}, {"retry-after": "0.3"})
            t0 = time.perf_counter()
            with pytest.raises(EngineError, match=r"HTTP 429 after 3 attempts: slow down"):
                await engine.generate([GenerationRequest("hi")])
            assert len(_completion_hits(stub)) == 3 and time.perf_counter() - t0 >= 0.6

            # A server restarted with another model: named, with the closest served name.
            stub.routes[("GET", "/v1/models")] = (200, {"data": [{"id": "m2"}]})
            stub.routes[("POST", "/v1/completions")] = (404, {"error": {"message": "The model `m` does not exist."}})
            with pytest.raises(EngineError, match=r"model 'm' is not served at .*\['m2'\]\. Did you mean 'm2'\?"):
                await engine.generate([GenerationRequest("hi")])

    _run(go())


def test_a_traces_session_id_goes_in_the_session_header_of_every_request(stub):
    """A prefix-aware router keeps a trace on one replica by this header (stepspec.engine.session)."""
    from stepspec.engine.session import TRACE_SESSION

    stub.routes[("POST", "/v1/completions")] = (200, {"choices": [{"index": 0, "text": "ab", "finish_reason": "stop",
                                                                  "token_ids": [5, 6]}],
                                                      "usage": {"prompt_tokens": 1}})

    async def calls(session, **kwargs):
        stub.headers_seen.clear()
        if session:
            TRACE_SESSION.set(session)
        async with OpenAIEngine(stub.url, "m", **kwargs) as engine:
            await engine.generate([GenerationRequest("hi")])
            await engine.generate([GenerationRequest("ho")])
        return [h.get("X-Session-ID") or h.get("x-session-id") for h in stub.headers_seen[-2:]]

    assert _run(calls("trace-1")) == ["trace-1", "trace-1"]
    assert _run(calls(None)) == [None, None]  # no trace calling: no header
    stub.headers_seen.clear()
    _run(calls("trace-2", session_header="x-user-id"))
    assert [h.get("x-user-id") for h in stub.headers_seen[-2:]] == ["trace-2", "trace-2"]
    _run(calls("trace-3", session_header=None))
    assert not any("trace-3" in h.values() for h in stub.headers_seen)


def test_finish_reasons_usage_and_spec_metrics_from_canned_answers(stub):
    spec = {
        "mean_acceptance_length": 2.33,
        "draft_acceptance_rate": 0.67,
        "acceptance_histogram": [1, 0, 2],  # 3 steps: accepted 0, 2, 2 tokens
        "num_spec_steps": 3,
        "num_accepted_draft_tokens": 4,
        "num_draft_tokens": 6,
        "num_spec_tokens": 2,
    }
    stub.routes[("POST", "/v1/completions")] = (
        200,
        {
            "choices": [
                {
                    "index": 0,
                    "text": "ab",
                    "finish_reason": "stop",
                    "stop_reason": None,
                    "token_ids": [5, 6],
                }
            ],
            "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
            "metrics": {"speculative_decoding": spec},
        },
    )
    engine = OpenAIEngine(stub.url, "m")

    async def generate(request):
        try:
            return await engine.generate([request])
        finally:
            await engine.close()

    [r] = _run(generate(GenerationRequest([1, 2, 3], Sampling(max_tokens=500, seed=7))))
    c = r.completion
    assert (c.text, c.token_ids, c.finish_reason, c.stop_string) == (
        "ab",
        (5, 6),
        FinishReason.EOS,
        None,
    )
    assert (r.num_prompt_tokens, r.num_cached_prompt_tokens) == (3, 2)
    s = c.spec_decoding
    assert (s.num_spec_tokens, s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (
        2,
        3,
        6,
        4,
    )
    assert s.num_accepted_tokens_per_pos == [2, 2]
    assert s.mean_acceptance_length == pytest.approx(1 + 4 / 3)
    stats = engine.stats()
    assert stats.spec_decoding.to_dict() == s.to_dict()
    assert (stats.num_requests, stats.num_prompt_tokens, stats.num_cached_prompt_tokens) == (
        1,
        3,
        2,
    )
    assert stats.num_output_tokens == 2
    [sent] = _completion_hits(stub)
    # max_tokens is capped at the served max_model_len; token prompts go as ints.
    assert sent["prompt"] == [1, 2, 3] and sent["max_tokens"] == 64 and sent["seed"] == 7
    assert sent["return_token_ids"] is True and "add_special_tokens" not in sent
    assert engine.info.max_model_len == 64 and engine.info.backend == "openai"

    # SGLang names the stop reason matched_stop; no cached-token report -> None.
    stub.routes[("POST", "/v1/completions")] = (
        200,
        {
            "choices": [
                {
                    "index": 0,
                    "text": "x",
                    "finish_reason": "stop",
                    "matched_stop": "\n",
                    "token_ids": [9],
                }
            ],
            "usage": {"prompt_tokens": 1},
        },
    )
    [r] = _run(generate(GenerationRequest("q", Sampling(stop=("\n",)))))
    assert (r.completion.finish_reason, r.completion.stop_string) == (FinishReason.STOP, "\n")
    assert r.num_cached_prompt_tokens is None and r.completion.spec_decoding is None
    sent = _completion_hits(stub)[-1]
    assert sent["add_special_tokens"] is False and sent["stop"] == ["\n"]
    assert sent["include_stop_str_in_output"] is False


# Scoring continuations against canned answers: prefix [1, 2, 3], continuation [4, 5, 6],
# top_k=2. The model's view at the continuation's positions (prompt indexes 3, 4, 5):
#   index 3: token 4 is second (-0.5) after 7 (-0.3)
#   index 4: token 5 is far down (-4.0, rank 9); the top two are 9 (-0.1) and 7 (-1.0)
#   index 5: token 6 is the model's own choice (-0.2); then 8 (-2.5)
SCORED_PREFIX = [1, 2, 3]
SCORED_CONTINUATION = [4, 5, 6]


def _prompt_logprobs_answer(prompt: list[int], cached: int = 0) -> dict:
    """vLLM's answer to a prompt_logprobs=2 request: per position the prompt token
    (with its rank) and the top 2, keyed by token id; None at index 0."""
    at = {
        3: {"4": {"logprob": -0.5, "rank": 2, "decoded_token": None},
            "7": {"logprob": -0.3, "rank": 1, "decoded_token": None}},
        4: {"5": {"logprob": -4.0, "rank": 9, "decoded_token": None},
            "9": {"logprob": -0.1, "rank": 1, "decoded_token": None},
            "7": {"logprob": -1.0, "rank": 2, "decoded_token": None}},
        5: {"6": {"logprob": -0.2, "rank": 1, "decoded_token": None},
            "8": {"logprob": -2.5, "rank": 2, "decoded_token": None}},
    }  # fmt: skip
    other = lambda tok: {str(tok): {"logprob": -1.5, "rank": 1, "decoded_token": None}}
    positions = [None] + [at.get(t, other(tok)) for t, tok in enumerate(prompt)][1:]
    return {
        "choices": [{"index": 0, "text": "x", "finish_reason": "length", "stop_reason": None,
                     "prompt_logprobs": positions}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    }  # fmt: skip


def _echo_answer(prompt: list[int]) -> dict:
    """A plain server's answer to echo=true, logprobs=2, max_tokens=1: the prompt and the
    generated token 9, keyed as token_id:N. At index 3 the top list holds the token; at
    index 4 it holds the token beyond the top 2 (as vLLM does); at index 5 it does not
    hold it (as servers that return only the top 2 do), although it is the best."""
    key = lambda t: f"token_id:{t}"
    tops = {3: {key(7): -0.3, key(4): -0.5}, 4: {key(9): -0.1, key(7): -1.0, key(5): -4.0},
            5: {key(8): -2.5, key(7): -3.0}}  # fmt: skip
    token_lps = {3: -0.5, 4: -4.0, 5: -0.2}
    return {
        "choices": [{"index": 0, "text": "x", "finish_reason": "length", "logprobs": {
            "tokens": [key(t) for t in [*prompt, 9]],
            "token_logprobs": [None] + [token_lps.get(t, -1.5) for t in range(1, len(prompt))] + [-0.1],
            "top_logprobs": [None] + [tops.get(t, {key(tok): -1.5}) for t, tok in enumerate(prompt)][1:]
            + [{key(9): -0.1}],
        }}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1},
    }  # fmt: skip


def test_score_continuations_prompt_logprobs(stub, caplog):
    stub.routes[("POST", "/tokenize")] = (200, {"tokens": SCORED_PREFIX})

    def answer(body):
        assert "echo" not in body and body["max_tokens"] == 1 and body["temperature"] == 0
        # The first prompt's cache hit reaches the continuation unless the request is salted.
        stale = body["prompt"] == [1, 2, 3, 4] and "cache_salt" not in body
        return 200, _prompt_logprobs_answer(body["prompt"], cached=4 if stale else 0)

    stub.routes[("POST", "/v1/completions")] = answer
    requests = [
        ContinuationRequest([1, 2, 3], [4], top_k=2),
        ContinuationRequest("one two three", SCORED_CONTINUATION, top_k=2),
        ContinuationRequest(SCORED_PREFIX, SCORED_CONTINUATION, top_k=1),
    ]

    async def go():
        async with OpenAIEngine(stub.url, "m") as engine:
            return await engine.score_continuations(requests), engine.stats()

    with caplog.at_level("INFO", logger="stepspec.engine.openai_backend"):
        (salted, text, top1), stats = _run(go())
    assert "scoring continuations with prompt_logprobs" in caplog.text
    assert text.tokens == (
        ScoredToken(4, -0.5, 2, ((7, -0.3), (4, -0.5))),
        ScoredToken(5, -4.0, 9, ((9, -0.1), (7, -1.0))),
        ScoredToken(6, -0.2, 1, ((6, -0.2), (8, -2.5))),
    )
    assert (text.num_prompt_tokens, text.num_cached_prompt_tokens) == (6, 0)
    assert [t.top for t in top1.tokens] == [((7, -0.3),), ((9, -0.1),), ((6, -0.2),)]
    assert [t.rank for t in top1.tokens] == [2, 9, 1]
    # The stale answer was asked again with a fresh cache_salt; its result is the salted one.
    assert salted.tokens == (ScoredToken(4, -0.5, 2, ((7, -0.3), (4, -0.5))),)
    assert salted.num_cached_prompt_tokens == 0
    sent = _completion_hits(stub)
    assert [b["prompt"] for b in sent].count([1, 2, 3, 4]) == 2 and sum("cache_salt" in b for b in sent) == 1
    assert all(b["prompt_logprobs"] in (1, 2) for b in sent)
    assert [b["prompt"] for b in sent if b["prompt"] != [1, 2, 3, 4]] == [[1, 2, 3, 4, 5, 6]] * 2
    assert (stats.num_requests, stats.num_prompt_tokens, stats.num_output_tokens) == (3, 16, 3)

    # A cache hit that a fresh salt does not avoid is an error naming the fix.
    stub.routes[("POST", "/v1/completions")] = lambda body: (200, _prompt_logprobs_answer(body["prompt"], 6))

    async def go_stale():
        async with OpenAIEngine(stub.url, "m") as engine:
            await engine.score_continuations([requests[2]])

    with pytest.raises(EngineError, match=r"read 6 of 6 prompt tokens.*--no-enable-prefix-caching"):
        _run(go_stale())


@pytest.mark.parametrize("refusal", ["refused", "ignored"])
def test_score_continuations_echo_fallback(stub, caplog, refusal):
    def answer(body):
        if "prompt_logprobs" in body:
            if refusal == "refused":
                return 400, {"error": {"message": "Unrecognized request argument supplied: prompt_logprobs"}}
            return 200, {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
        assert body["echo"] is True and body["logprobs"] == 2 and body["max_tokens"] == 1
        assert body["return_tokens_as_token_ids"] is True
        return 200, _echo_answer(body["prompt"])

    stub.routes[("POST", "/v1/completions")] = answer
    request = ContinuationRequest(SCORED_PREFIX, SCORED_CONTINUATION, top_k=2)

    async def go():
        async with OpenAIEngine(stub.url, "m") as engine:
            first = await engine.score_continuations([request])
            stub.hits.clear()
            return first, await engine.score_continuations([request, request])

    with caplog.at_level("INFO", logger="stepspec.engine.openai_backend"):
        [first], again = _run(go())
    assert "scoring continuations with echo" in caplog.text
    assert ("HTTP 400" if refusal == "refused" else "without prompt_logprobs") in caplog.text
    assert first.tokens == (
        ScoredToken(4, -0.5, 2, ((7, -0.3), (4, -0.5))),
        ScoredToken(5, -4.0, 3, ((9, -0.1), (7, -1.0))),  # beyond the top 2: rank top_k + 1
        ScoredToken(6, -0.2, 3, ((8, -2.5), (7, -3.0))),  # missing from the top list: top_k + 1
    )
    assert (first.num_prompt_tokens, first.num_cached_prompt_tokens) == (6, None)
    assert again == [first, first]
    # The engine remembers the mode: no more prompt_logprobs probes.
    assert len(_completion_hits(stub)) == 2 and all(b["echo"] for b in _completion_hits(stub))


def test_score_continuations_errors(stub):
    def answer(body):
        if "prompt_logprobs" in body:
            return 400, {"error": {"message": "unknown field prompt_logprobs"}}
        return 200, {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}

    stub.routes[("POST", "/v1/completions")] = answer

    async def score(*requests):
        async with OpenAIEngine(stub.url, "m") as engine:
            return await engine.score_continuations(requests)

    with pytest.raises(EngineError) as e:
        _run(score(ContinuationRequest(SCORED_PREFIX, SCORED_CONTINUATION, top_k=2)))
    msg = str(e.value)
    assert "cannot score continuations" in msg and "unknown field prompt_logprobs" in msg
    assert "echo + logprobs" in msg and "without logprobs" in msg and "Serve the model with vLLM" in msg

    # Too long for the served max_model_len (64): refused before anything is sent.
    stub.hits.clear()
    with pytest.raises(EngineError, match=r"64 tokens \(60 \+ 4\) but max_model_len is 64.*--max-model-len"):
        _run(score(ContinuationRequest([1] * 10, [2]), ContinuationRequest([1] * 60, [2] * 4)))
    assert _completion_hits(stub) == []
    with pytest.raises(EngineError, match="empty prefix"):
        _run(score(ContinuationRequest([], [2])))

    # Any other refusal of prompt_logprobs is the server's error, not a reason to switch.
    stub.routes[("POST", "/v1/completions")] = (
        400, {"error": {"message": "Requested prompt logprobs of 30, which is greater than max allowed: 20"}},
    )  # fmt: skip
    with pytest.raises(EngineError, match=r"HTTP 400: the server refused the request: Requested prompt logprobs"):
        _run(score(ContinuationRequest(SCORED_PREFIX, [4], top_k=30)))
    assert all("prompt_logprobs" in b for b in _completion_hits(stub))


# -- the event loop is never blocked --------------------------------------------------

# The longest a ticker waking every 5 ms may wait while a judge runs: about 6 ms on an idle
# 2-core machine, up to 70 ms seen beside a vLLM server test; a synchronous request to the
# slow stub (SLOW_ANSWER_S an answer) would block for longer than SLOW_ANSWER_S.
LOOP_BLOCK_BOUND_S = 0.1
SLOW_ANSWER_S = 0.3


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A local tokenizer folder with a chat template (a tiny byte-level BPE, no model): the
    served model's ``root`` in the stub's ``/v1/models`` card, as vLLM reports its model path."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tiny_models import CHAT_TEMPLATE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([PROMPT, SCORED_TEXT, "Score: 0 1 2 3 4 5 6 7 8 9"] * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    out = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(out)
    return out


def _serve_model_slowly(stub: _Stub, tokenizer_dir: Path, delay_s: float, root: str | None = None):
    """The stub as a slow vLLM server of ``tokenizer_dir``'s model: ``/tokenize`` (text or
    chat), ``/detokenize``, and ``/v1/completions`` answering a score judge's next-token
    request (``7`` most likely) and a likelihood judge's prompt_logprobs request (every
    prompt token rank 1). ``root``: the model path its card names (default: ``tokenizer_dir``).
    Returns the tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    card = {"id": "m", "max_model_len": 512, "root": root or str(tokenizer_dir)}
    stub.routes[("GET", "/v1/models")] = (200, {"data": [card]})

    def tokenize(body):
        if "messages" not in body:
            return 200, {"tokens": tok.encode(body["prompt"], add_special_tokens=False)}
        text = tok.apply_chat_template(body["messages"], tokenize=False,
                                       add_generation_prompt=body["add_generation_prompt"],
                                       continue_final_message=body["continue_final_message"])
        return 200, {"tokens": tok.encode(text, add_special_tokens=False)}

    def complete(body):
        usage = {"prompt_tokens": len(body["prompt"]) if isinstance(body["prompt"], list) else 9}
        choice = {"index": 0, "text": "7", "finish_reason": "length", "stop_reason": None}
        if "prompt_logprobs" in body:
            choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": -0.1, "rank": 1}} for t in body["prompt"][1:]]
        else:
            digit = lambda d: f"token_id:{tok.convert_tokens_to_ids(d)}"
            choice["logprobs"] = {"top_logprobs": [{digit("7"): -0.1, digit("3"): -2.5}]}
        return 200, {"choices": [choice], "usage": usage}

    stub.routes[("POST", "/tokenize")] = tokenize
    stub.routes[("POST", "/detokenize")] = lambda body: (200, {"prompt": tok.decode(body["tokens"])})
    stub.routes[("POST", "/v1/completions")] = complete
    stub.delay_s = delay_s
    return tok


async def _longest_loop_stall(work) -> tuple[object, float]:
    """``work``'s result, and the longest a ticker that sleeps 5 ms at a time waited for
    the event loop while ``work`` ran."""
    gaps = [0.0]

    async def tick():
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        return await work, max(gaps)
    finally:
        ticker.cancel()


@pytest.mark.parametrize("judge_name, tokenizer_here", [("score", True), ("likelihood", True), ("likelihood", False)])
def test_a_judge_never_blocks_the_event_loop(stub, tokenizer_dir, judge_name, tokenizer_here):
    """While a judge waits for a slow server (SLOW_ANSWER_S an answer), the event loop keeps
    running: rendering the judge prompt and tokenizing send nothing, and whatever does go
    to the server (completions; /tokenize when the model's tokenizer is not here) is awaited."""
    from stepspec.judges.base import StepCandidate
    from stepspec.judges.likelihood import LikelihoodJudge
    from stepspec.judges.score import ScoreJudge

    tok = _serve_model_slowly(stub, tokenizer_dir, delay_s=SLOW_ANSWER_S, root=None if tokenizer_here else "/no/such/model")
    draft = " 0.2 per minute"

    async def go():
        async with OpenAIEngine(stub.url, "m") as engine:
            ids = tuple(tok.encode(draft, add_special_tokens=False)) if judge_name == "likelihood" else ()
            judge = ScoreJudge(engine, threshold=6) if judge_name == "score" else LikelihoodJudge(engine)
            candidate = StepCandidate(question=PROMPT, previous_steps=("Step 1: 48 / 2 = 24.",), draft_step=draft,
                                      prefix=PROMPT if ids else None, draft_token_ids=ids)
            stub.hits.clear()
            t0 = time.perf_counter()
            [verdict], stall = await _longest_loop_stall(judge.judge([candidate]))
            return verdict, stall, time.perf_counter() - t0

    verdict, stall, seconds = _run(go())
    assert stall < LOOP_BLOCK_BOUND_S, f"the event loop was blocked for {stall * 1000:.0f} ms while the judge ran"
    assert verdict.accept and seconds >= SLOW_ANSWER_S  # it waited for the slow server
    if judge_name == "score":
        assert verdict.score == pytest.approx(3 + 4 / (1 + math.exp(-2.4)))  # 7 at -0.1, 3 at -2.5
    asked = {path for _, path, _ in stub.hits}
    assert asked == ({"/v1/completions"} if tokenizer_here else {"/tokenize", "/v1/completions"})


def test_sync_tokenizer_methods_never_ask_the_server(stub, tokenizer_dir):
    """encode, count_tokens and apply_chat_template use the tokenizer start() loaded: the
    ``tokenizer`` argument, else the served model's root when this machine has it."""
    conversation = [{"role": "user", "content": "Natalia sold 48 clips."}, {"role": "assistant", "content": "Score:"}]

    async def check(root: str, **kwargs):
        stub.routes[("GET", "/v1/models")] = (200, {"data": [{"id": "m", "max_model_len": 64, "root": root}]})
        async with OpenAIEngine(stub.url, "m", **kwargs) as engine:
            stub.hits.clear()
            if root == "/no/such/model" and not kwargs:
                with pytest.raises(EngineError, match=r"'/no/such/model'\) is not here; pass tokenizer="):
                    engine.apply_chat_template(conversation)
                return
            assert engine.count_tokens(PROMPT) == len(engine.encode(PROMPT)) > 1
            assert engine.apply_chat_template(conversation, continue_final_message=True) == (
                "<|im_start|>user\nNatalia sold 48 clips.<|im_end|>\n<|im_start|>assistant\nScore:")
            assert engine.apply_chat_template(conversation[:1]).endswith("<|im_end|>\n<|im_start|>assistant\n")
            assert stub.hits == []

    for root in (str(tokenizer_dir), "/no/such/model"):
        _run(check(root))
        _run(check(root, tokenizer=str(tokenizer_dir)))
    with pytest.raises(EngineError, match=r"could not load tokenizer '/no/such/tokenizer'"):
        _run(check(str(tokenizer_dir), tokenizer="/no/such/tokenizer"))


# float32 on both sides, yet not the same arithmetic: the server and the in-process engine
# batch the requests differently and hold different prefixes in their caches (cached
# positions take another attention path), and this random model's large logits carry that
# into its logprobs: up to 5e-4 apart, the same on every run. A wrong position is off by far more.
FLOAT_NOISE = 1e-3


def assert_same_ranking(got, want):
    """The same (token id, logprob) list up to float noise: ids may differ only where the
    reference has a near-tie (neighbours within FLOAT_NOISE) or in the last place (a near-tie
    with the first token left out)."""
    assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=FLOAT_NOISE)
    lps = [lp for _, lp in want]
    for i, ((g, _), (w, lp)) in enumerate(zip(got, want)):
        near = [lps[j] for j in (i - 1, i + 1) if 0 <= j < len(lps)]
        assert g == w or i == len(want) - 1 or any(abs(lp - x) <= FLOAT_NOISE for x in near), (i, got, want)


def assert_same_rank(rank, want, known=None):
    """``rank`` is ``want``'s rank (capped at ``known``) up to near-ties: one place at the top,
    where a top entry is within FLOAT_NOISE of the token; anywhere in the tail below the top
    (this random model is flat there: 50 ranks span 0.04 nats, so float noise reorders it)."""
    cap = (lambda r: min(r, known)) if known else (lambda r: r)
    if cap(rank) == cap(want.rank):
        return
    if want.rank <= len(want.top) + 1:
        assert abs(rank - want.rank) == 1 and any(abs(want.logprob - lp) <= FLOAT_NOISE for _, lp in want.top)
    else:
        assert rank > len(want.top) + 1, (rank, want)

# -- real vLLM server ----------------------------------------------------------------


async def _reference_outputs(model_path: Path, token_prompt: list[int]) -> dict:
    """What the in-process backend answers for the prompts the server tests use."""
    from stepspec.engine.vllm_backend import VLLMEngine

    engine = VLLMEngine(
        str(model_path),
        max_model_len=MAX_MODEL_LEN,
        kv_cache_gib=0.25,
        engine_args={"enforce_eager": True},
    )
    async with engine:
        greedy, logprobs, tokens = await engine.generate(
            [
                GenerationRequest(PROMPT, Sampling(max_tokens=MAX_TOKENS)),
                GenerationRequest(PROMPT, Sampling(max_tokens=4, logprobs=TOP_K)),
                GenerationRequest(token_prompt, Sampling(max_tokens=8)),
            ]
        )
        [next_token] = await engine.next_token_logprobs([PROMPT], top_k=TOP_K)
        scoring = _scoring_requests(greedy.completion.token_ids, token_prompt, engine.encode(SCORED_TEXT))
        scores = await engine.score_continuations(scoring)
    return {"greedy": greedy, "logprobs": logprobs, "tokens": tokens, "next_token": next_token,
            "scoring": scoring, "scores": scores}  # fmt: skip


def _scoring_requests(greedy_ids, token_prompt: list[int], other_ids: list[int]) -> list[ContinuationRequest]:
    """The model's own greedy tokens after PROMPT (all rank 1), and a continuation it
    would not write, after a token prefix and after a text prefix."""
    return [
        ContinuationRequest(PROMPT, greedy_ids[:6], top_k=TOP_K),
        ContinuationRequest(token_prompt, other_ids, top_k=TOP_K),
        ContinuationRequest(PROMPT + " altogether", other_ids, top_k=1),
    ]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base_url, model path, in-process reference outputs, local tokenizer).

    The server boots while the in-process engine computes the reference outputs; it
    is stopped by PID on the way out whatever happened.
    """
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("openai_backend")
    model_path = build_tiny_model(root / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    proc = start_vllm_server(model_path, port, log, served_name=SERVED_NAME, max_model_len=MAX_MODEL_LEN,
                             args=["--max-logprobs", "20"])
    try:
        token_prompt = tokenizer.encode(TOKEN_PROMPT_TEXT, add_special_tokens=False)
        reference = _run(_reference_outputs(model_path, token_prompt))
        reference["token_prompt"] = token_prompt
        wait_healthy(proc, base_url, log)
        yield base_url, model_path, reference, tokenizer
    finally:
        stop_process(proc)


@pytest.mark.vllm
@pytest.mark.server
def test_matches_in_process_backend(served):
    base_url, _, ref, _ = served

    async def go():
        async with OpenAIEngine(f"{base_url}/v1", SERVED_NAME) as engine:
            results = await engine.generate(
                [
                    GenerationRequest(PROMPT, Sampling(max_tokens=MAX_TOKENS)),
                    GenerationRequest(PROMPT, Sampling(max_tokens=4, logprobs=TOP_K)),
                    GenerationRequest(ref["token_prompt"], Sampling(max_tokens=8)),
                ]
            )
            [next_token] = await engine.next_token_logprobs([PROMPT], top_k=TOP_K)
            return results, next_token, engine.stats(), engine.info

    (greedy, logprobs, tokens), next_token, stats, info = _run(go())
    assert greedy.completion.text == ref["greedy"].completion.text
    assert greedy.completion.token_ids == ref["greedy"].completion.token_ids
    assert greedy.completion.finish_reason == FinishReason.LENGTH
    assert greedy.completion.num_output_tokens == MAX_TOKENS
    assert greedy.num_prompt_tokens == ref["greedy"].num_prompt_tokens
    assert tokens.completion.token_ids == ref["tokens"].completion.token_ids
    assert tokens.num_prompt_tokens == len(ref["token_prompt"])

    # Per-token logprobs: same ids and texts, same values up to float noise, top-k+1 at most.
    got, want = logprobs.completion.logprobs, ref["logprobs"].completion.logprobs
    assert [t.token_id for t in got] == [t.token_id for t in want]
    assert [t.token for t in got] == [t.token for t in want]
    for g, w in zip(got, want):
        assert g.logprob == pytest.approx(w.logprob, abs=FLOAT_NOISE)
        assert TOP_K <= len(g.top) <= TOP_K + 1
        assert_same_ranking([(e[0], e[2]) for e in g.top], [(e[0], e[2]) for e in w.top])
        assert {e[0]: e[1] for e in g.top if e[0] in {x[0] for x in w.top}} == {
            e[0]: e[1] for e in w.top if e[0] in {x[0] for x in g.top}}  # same texts
        assert [e[2] for e in g.top] == sorted((e[2] for e in g.top), reverse=True)

    # Next-token distribution: top_k entries, sorted, same top token id and text.
    assert len(next_token.top) == TOP_K
    assert [e[2] for e in next_token.top] == sorted((e[2] for e in next_token.top), reverse=True)
    assert next_token.top[0][:2] == ref["next_token"].top[0][:2]
    assert [e[0] for e in next_token.top] == [e[0] for e in ref["next_token"].top]
    assert next_token.top[0][0] == greedy.completion.token_ids[0]

    assert stats.num_requests == 4
    assert stats.num_output_tokens == MAX_TOKENS + 4 + 8 + 1
    assert stats.num_prompt_tokens == 3 * greedy.num_prompt_tokens + len(ref["token_prompt"])
    assert stats.generate_seconds > 0
    assert info.backend == "openai" and info.max_model_len == MAX_MODEL_LEN


@pytest.mark.vllm
@pytest.mark.server
def test_score_continuations_match_in_process_backend(served):
    base_url, _, ref, _ = served
    requests, want = ref["scoring"], ref["scores"]

    async def go():
        async with OpenAIEngine(base_url, SERVED_NAME) as engine:
            got = await engine.score_continuations(requests)
            mode, stats = engine.scoring_mode, engine.stats()
        # The echo path against the same server (as used where prompt_logprobs is unknown).
        async with OpenAIEngine(base_url, SERVED_NAME, continuation_scoring="echo") as echo:
            echoed = await echo.score_continuations(requests)
        return got, mode, stats, echoed

    got, mode, stats, echoed = _run(go())
    assert mode == "prompt_logprobs"
    assert [t.rank for t in want[0].tokens] == [1] * 6  # the model's own greedy tokens
    assert any(t.rank > 1 for t in want[1].tokens)
    for request, g, e, w in zip(requests, got, echoed, want):
        assert g.num_prompt_tokens == e.num_prompt_tokens == w.num_prompt_tokens
        # This server does not report cached tokens (no --enable-prompt-tokens-details).
        assert g.num_cached_prompt_tokens is None
        assert [t.token_id for t in g.tokens] == [t.token_id for t in w.tokens] == list(request.continuation)
        for gt, et, wt in zip(g.tokens, e.tokens, w.tokens):
            assert gt.logprob == pytest.approx(wt.logprob, abs=FLOAT_NOISE)
            assert et.logprob == pytest.approx(wt.logprob, abs=FLOAT_NOISE)
            assert_same_rank(gt.rank, wt)
            assert_same_rank(et.rank, wt, known=request.top_k + 1)  # echo: ranks beyond top_k unknown
            assert len(gt.top) == len(et.top) == request.top_k
            for top in (gt.top, et.top):
                assert_same_ranking(top, wt.top)
    assert (stats.num_requests, stats.num_output_tokens) == (3, 3)
    assert stats.num_prompt_tokens == sum(w.num_prompt_tokens for w in want)


@pytest.mark.vllm
@pytest.mark.server
def test_stop_strings_length_and_token_prompt(served):
    base_url, _, ref, tokenizer = served
    ref_ids = ref["greedy"].completion.token_ids
    ref_text = ref["greedy"].completion.text
    # A stop string the greedy continuation is known to produce: its second token.
    stop = tokenizer.decode([ref_ids[1]])
    assert stop and stop in ref_text
    before = ref_text[: ref_text.index(stop)]

    async def go():
        async with OpenAIEngine(base_url, SERVED_NAME) as engine:
            return await engine.generate(
                [
                    GenerationRequest(PROMPT, Sampling(max_tokens=MAX_TOKENS, stop=(stop,))),
                    GenerationRequest(
                        PROMPT,
                        Sampling(max_tokens=MAX_TOKENS, stop=(stop,), include_stop_str=True),
                    ),
                    GenerationRequest(PROMPT, Sampling(max_tokens=3)),
                    GenerationRequest(ref["token_prompt"], Sampling(max_tokens=3, logprobs=0)),
                    GenerationRequest(
                        PROMPT, Sampling(max_tokens=3, temperature=1.0, seed=1, n=2)
                    ),
                ]
            )

    stopped, stopped_incl, short, tokens, sampled = _run(go())
    assert stopped.completion.finish_reason == FinishReason.STOP
    assert stopped.completion.stop_string == stop
    assert stopped.completion.text == before
    assert stopped_incl.completion.text == before + stop
    assert stopped_incl.completion.stop_string == stop

    assert short.completion.finish_reason == FinishReason.LENGTH
    assert short.completion.token_ids == ref_ids[:3]
    assert short.completion.stop_string is None

    assert tokens.completion.token_ids == ref["tokens"].completion.token_ids[:3]
    for entry in tokens.completion.logprobs:  # logprobs=0: the sampled token only
        [(top_id, _, top_lp)] = entry.top
        assert (top_id, top_lp) == (entry.token_id, entry.logprob)
        # Here every sampled text is the token alone: vLLM reports "" for a partial
        # UTF-8 token in top and falls back to the token decoded alone.
        assert entry.token == tokenizer.decode([entry.token_id])

    assert len(sampled.completions) == 2
    assert all(c.num_output_tokens == 3 for c in sampled.completions)


@pytest.mark.vllm
@pytest.mark.server
def test_tokenizer_endpoints_match_local_tokenizer(served):
    base_url, model_path, _, tokenizer = served

    async def started(**kwargs):
        engine = OpenAIEngine(base_url, SERVED_NAME, **kwargs)
        await engine.start()
        return engine

    # The server's model (its /v1/models root) is this machine's folder: loaded from there.
    remote, local = _run(started()), _run(started(tokenizer=str(model_path)))
    assert remote.tokenizer is not None and remote.tokenizer_name is None
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Natalia sold 48 clips. How many in May?"},
        {"role": "assistant", "content": "Score:"},
    ]
    try:
        for text in ("Step 1: 48 / 2 = 24.", "<|im_start|>user\nhi<|im_end|>", " \\boxed{10}\n"):
            expected = len(tokenizer.encode(text, add_special_tokens=False))
            assert remote.count_tokens(text) == expected == local.count_tokens(text)
        for kwargs in ({}, {"continue_final_message": True}, {"add_generation_prompt": False}):
            messages = conversation if kwargs.get("continue_final_message") else conversation[:2]
            expected = tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=kwargs.get("add_generation_prompt", True)
                and not kwargs.get("continue_final_message", False),
                continue_final_message=kwargs.get("continue_final_message", False),
            )
            assert remote.apply_chat_template(messages, **kwargs) == expected
            assert local.apply_chat_template(messages, **kwargs) == expected
            assert _run(remote.aapply_chat_template(messages, **kwargs)) == expected
        assert remote.apply_chat_template(conversation, continue_final_message=True).endswith(
            "<|im_start|>assistant\nScore:"
        )
        # A machine without the model: the async methods ask the server, and agree.
        remote._tokenizer = None
        for kwargs in ({}, {"continue_final_message": True}):
            messages = conversation if kwargs.get("continue_final_message") else conversation[:2]
            assert _run(remote.aapply_chat_template(messages, **kwargs)) == local.apply_chat_template(messages, **kwargs)
        assert _run(remote.acount_tokens("Step 1: 48 / 2 = 24.")) == local.count_tokens("Step 1: 48 / 2 = 24.")
        with pytest.raises(EngineError, match="tokenizer="):
            remote.apply_chat_template(conversation[:2])
    finally:
        _run(remote.close())
        _run(local.close())


@pytest.mark.vllm
@pytest.mark.server
def test_unknown_model_lists_served_names(served):
    base_url, _, _, _ = served

    async def go():
        async with OpenAIEngine(base_url, "tinyy"):
            pass

    with pytest.raises(EngineError) as e:
        _run(go())
    assert "'tinyy' is not served" in str(e.value) and "['tiny']" in str(e.value)
    assert "Did you mean 'tiny'?" in str(e.value)


@pytest.mark.vllm
@pytest.mark.server
def test_over_long_prompt_carries_server_message(served):
    base_url, _, _, _ = served
    long_text = "Step 1: 48 / 2 = 24. " * 200  # far more than 1024 tokens

    async def go():
        async with OpenAIEngine(base_url, SERVED_NAME) as engine:
            await engine.generate([GenerationRequest(long_text, Sampling(max_tokens=2))])

    with pytest.raises(EngineError) as e:
        _run(go())
    msg = str(e.value)
    assert "HTTP 400" in msg and "maximum context length is 1024 tokens" in msg
    assert "shorten" in msg

    # A token prompt that does not fit is refused before it is sent, as in-process.
    async def go_tokens():
        async with OpenAIEngine(base_url, SERVED_NAME) as engine:
            await engine.generate([GenerationRequest([5] * 1100)])

    with pytest.raises(EngineError, match="1100 tokens but max_model_len is 1024"):
        _run(go_tokens())


def test_continuation_scoring_mode_is_checked_and_can_be_fixed():
    with pytest.raises(EngineError, match="continuation_scoring must be auto, prompt_logprobs or echo; got 'echos'"):
        OpenAIEngine("http://127.0.0.1:9", "m", continuation_scoring="echos")
    assert OpenAIEngine("http://127.0.0.1:9", "m").scoring_mode is None
    assert OpenAIEngine("http://127.0.0.1:9", "m", continuation_scoring="echo").scoring_mode == "echo"
