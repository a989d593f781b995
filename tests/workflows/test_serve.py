"""`stepspec serve`: an OpenAI-compatible endpoint, driven by real clients (the openai SDK,
httpx) over real HTTP (uvicorn in a thread), on scripted engines. Marked ``vllm``: the
request bodies are validated by vLLM's own OpenAI protocol models (no engine starts)."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx
import pytest

from openai_server import free_port, sdk_client, serving, stop_process, wait_healthy
from scripted import DRAFT_STEPS, Q, TARGET_STEPS, FixedJudge, script

pytestmark = pytest.mark.vllm

REASONING = "16 - 3 = 13 eggs.\n\n13 - 4 = 9 eggs.\n\n"  # the drafted steps the judge keeps, then the answer
ANSWER = "So she makes \\boxed{18}."


def reasoner(delay: float = 0.0, **kwargs):
    from stepspec.orchestrator.reasoner import Reasoner

    draft, target = script(*DRAFT_STEPS), script(*TARGET_STEPS)
    draft.delay = target.delay = delay or None  # each generate call waits (and can be cancelled there)
    return Reasoner(target, draft, strategy="specreason", judge=FixedJudge(True), first_target_steps=0, **kwargs)


def run_32_streams(one, timeout: float, record_property) -> None:
    """32 streams at once (``one(i, http)`` each): the first 5 hang up ("gone"), the others
    end ("done"); their p50/p99 latencies are recorded as test properties."""
    async def load():
        async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=64)) as http:
            return await asyncio.gather(*(one(i, http) for i in range(32)))

    results = asyncio.run(load())
    assert [r for r, _ in results] == ["gone"] * 5 + ["done"] * 27
    latencies = sorted(t for r, t in results if r == "done")
    record_property("p50_s", statistics.median(latencies))
    record_property("p99_s", latencies[int(0.99 * (len(latencies) - 1))])


def test_the_openai_sdk_gets_the_steps_as_reasoning_and_the_answer_as_content_streamed_or_not():
    with serving({"stepspec": reasoner()}) as url:
        sdk = sdk_client(url)
        assert [m.id for m in sdk.models.list().data] == ["stepspec"]
        reply = sdk.chat.completions.create(model="stepspec", messages=[{"role": "user", "content": Q}])
        message = reply.choices[0].message
        assert message.content == ANSWER and message.model_extra["reasoning_content"] == REASONING
        assert reply.choices[0].finish_reason == "stop"
        stats = reply.model_extra["stepspec"]
        assert stats["num_steps"] == 3 and stats["num_drafted_steps"] == 3 and stats["target_token_share"] == 0
        assert reply.usage.completion_tokens == stats["num_tokens"] > 0 and reply.usage.prompt_tokens > 0

        chunks = list(sdk.chat.completions.create(model="stepspec", messages=[{"role": "user", "content": Q}],
                                                  stream=True, stream_options={"include_usage": True}))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        reasoning = [d.model_extra.get("reasoning_content") for d in deltas if d.model_extra.get("reasoning_content")]
        assert reasoning == ["16 - 3 = 13 eggs.\n\n", "13 - 4 = 9 eggs.\n\n"]  # a step per event, once final
        assert "".join(d.content or "" for d in deltas) == ANSWER
        assert deltas[0].role == "assistant" and chunks[-2].choices[0].finish_reason == "stop"
        assert chunks[-1].usage.completion_tokens == stats["num_tokens"] and not chunks[-1].choices

        # /v1/completions: the trace's text, whole or streamed, cut at a stop string
        done = sdk.completions.create(model="stepspec", prompt=Q)
        assert done.choices[0].text == REASONING + ANSWER
        streamed = list(sdk.completions.create(model="stepspec", prompt=Q, stream=True, stop=["9 eggs"]))
        assert "".join(c.choices[0].text for c in streamed) == "16 - 3 = 13 eggs.\n\n13 - 4 = "


def test_a_served_request_renders_its_prompt_once_for_the_model_that_writes():
    """The server measures the prompt (its tokens against the context) with the writing model's
    template and the trace starts from that rendering: one rendering per model, not one more."""
    served = reasoner()
    renders = {}
    for role, engine in (("target", served.target), ("draft", served.draft)):
        render = engine.aapply_chat_template

        async def counted(*args, role=role, render=render, **kwargs):
            renders[role] = renders.get(role, 0) + 1
            return await render(*args, **kwargs)

        engine.aapply_chat_template = counted
    with serving({"stepspec": served}) as url:
        reply = sdk_client(url).chat.completions.create(model="stepspec", messages=[{"role": "user", "content": Q}])
    assert reply.choices[0].message.content == ANSWER and reply.usage.prompt_tokens > 0
    assert renders["target"] == 1  # measured, then reused by the trace
    assert renders.get("draft", 0) <= 1  # its own model's template, once, if it is another model


def test_a_request_picks_its_strategy_and_options_through_extra_body_checked_by_their_declarations():
    with serving({"stepspec": reasoner()}) as url:
        sdk = sdk_client(url)
        ask = dict(model="stepspec", messages=[{"role": "user", "content": Q}])
        alone = sdk.chat.completions.create(**ask, extra_body={"stepspec": {"strategy": "target-only"}})
        assert alone.model_extra["stepspec"]["target_token_share"] == 1
        assert alone.choices[0].message.content == "The answer is \\boxed{18}."
        capped = sdk.chat.completions.create(**ask, max_tokens=4)
        assert capped.choices[0].finish_reason == "length" and capped.usage.completion_tokens <= 8
        from openai import BadRequestError

        for extra, message in [
            ({"strategy": "specreasn"}, "Did you mean 'specreason'"),
            ({"options": {"gama": 3}}, "gama"),
            ({"strategy": "tree", "options": {"k": "many"}}, "k"),
            ({"judge": "likelihod"}, "Did you mean 'likelihood'"),
            ({"stratgy": "tree"}, "Did you mean 'strategy'"),
        ]:
            with pytest.raises(BadRequestError, match=message):
                sdk.chat.completions.create(**ask, extra_body={"stepspec": extra})
        with pytest.raises(BadRequestError, match="'top_p' is not supported"):
            sdk.chat.completions.create(**ask, top_p=0.5)
        with pytest.raises(BadRequestError, match="n=2"):
            sdk.chat.completions.create(**ask, n=2)
        with pytest.raises(BadRequestError, match="temperature=0.7: strategy 'specreason' decodes greedily"):
            sdk.chat.completions.create(**ask, temperature=0.7)
        assert sdk.chat.completions.create(**ask, temperature=0, seed=3).choices[0].message.content == ANSWER


def test_bad_requests_get_the_right_4xx_naming_the_fix_and_the_server_serves_on(monkeypatch):
    monkeypatch.setenv("SERVE_TEST_KEY", "sesame")
    with serving({"stepspec": reasoner()}, api_key_env="SERVE_TEST_KEY", max_body_bytes=4096) as url:
        auth = {"Authorization": "Bearer sesame"}
        chat = f"{url}/v1/chat/completions"
        good = {"model": "stepspec", "messages": [{"role": "user", "content": Q}]}
        cases = [
            (dict(content=b'{"model": "stepspec", "messages": ['), 400, "not valid JSON"),
            (dict(json={"model": "stepspec"}), 400, "'messages' is required"),
            (dict(json={**good, "max_tokens": "many"}), 400, "max_tokens"),
            (dict(json={**good, "messages": [{"role": "user", "content": 3}]}), 400, "messages"),
            (dict(json={**good, "messages": [{"role": "assistant", "content": "hi"}]}), 400, "the last message"),
            (dict(json={**good, "model": "stepspek"}), 404, "Did you mean 'stepspec'"),
            (dict(json={**good, "frobnicate": 1}), 400, "unknown parameter 'frobnicate'"),
            (dict(json={**good, "messages": [{"role": "user", "content": "x" * 5000}]}), 413, "--max-body-bytes"),
        ]
        with httpx.Client(timeout=30) as http:
            for kwargs, status, message in cases:
                r = http.post(chat, headers=auth, **kwargs)
                assert r.status_code == status and message in r.json()["error"]["message"], (kwargs, r.text)
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = http.post(chat, json=good, headers=headers)
                assert r.status_code == 401 and "--api-key-env" in r.json()["error"]["message"]
            assert http.get(f"{url}/v1/models").status_code == 401
            assert http.get(f"{url}/health").json()["status"] == "ok"
            r = http.post(chat, json=good, headers=auth)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER


def test_beyond_max_concurrency_a_429_with_retry_after():
    slow = reasoner(delay=0.3)
    with serving({"stepspec": slow}, max_concurrency=1, retry_after_s=3) as url:
        good = {"model": "stepspec", "messages": [{"role": "user", "content": Q}]}

        async def both():
            async with httpx.AsyncClient(timeout=30) as http:
                first = asyncio.ensure_future(http.post(f"{url}/v1/chat/completions", json=good))
                await asyncio.sleep(0.2)
                second = await http.post(f"{url}/v1/chat/completions", json=good)
                return await first, second

        first, second = asyncio.run(both())
        assert first.status_code == 200
        assert second.status_code == 429 and second.headers["retry-after"] == "3"
        assert "--max-concurrency" in second.json()["error"]["message"]


def test_32_concurrent_streams_complete_and_5_that_disconnect_cancel_their_engine_requests(record_property):
    served = reasoner(delay=0.4, backoff=False)  # drafting at any load: every trace the same text
    with serving({"stepspec": served}) as url:
        body = {"model": "stepspec", "messages": [{"role": "user", "content": Q}], "stream": True}

        async def one(i: int, http: httpx.AsyncClient) -> tuple[str, float]:
            t0 = time.perf_counter()
            events = []
            async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    events.append(line[6:])
                    if i < 5 and len(events) == 2:  # the first reasoning step arrived: hang up
                        return "gone", time.perf_counter() - t0
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            text = "".join(c["choices"][0]["delta"].get("reasoning_content", "") +
                           (c["choices"][0]["delta"].get("content") or "") for c in chunks)
            assert text == REASONING + ANSWER
            return "done", time.perf_counter() - t0

        run_32_streams(one, 60, record_property)
        deadline = time.monotonic() + 10
        while served.target.running or served.draft.running:
            assert time.monotonic() < deadline, "the disconnected traces' engine requests are still running"
            time.sleep(0.05)
        # each hung up in its second step's call (a step takes 0.4 s, the server looks every 0.25 s)
        assert served.draft.num_cancelled + served.target.num_cancelled == 5
        with httpx.Client(timeout=10) as http:
            assert http.get(f"{url}/health").json()["in_flight"] == 0


def test_32_streams_on_real_vllm_engines_complete_and_5_hang_ups_leave_no_engine_request_running(
        tmp_path_factory, record_property):
    """The same load on in-process vLLM (tiny random models, one tokenizer): 27 streams end in
    [DONE]; the 5 that hang up asked for a budget far longer than the others' (hundreds of
    steps), yet within seconds of the others' end neither engine holds a request."""
    from conftest import tiny_engine
    from stepspec.orchestrator.budget import Budget
    from stepspec.orchestrator.reasoner import Reasoner
    from stepspec.orchestrator.steps import StepRules
    from tiny_models import build_tiny_model

    paths = [build_tiny_model(tmp_path_factory.mktemp(f"serve{seed}"), seed=seed, weight_std=0.5,
                              tie_word_embeddings=False) for seed in (0, 1)]
    target, draft = (tiny_engine(p, name=n, max_model_len=4096) for p, n in zip(paths, ("target", "draft")))
    # the tiny models write byte soup in which "ge" occurs: steps end there or at 8 tokens
    served = Reasoner(target, draft, strategy="specreason", rules=StepRules(delimiter="ge"), backoff=False,
                      budget=Budget(max_steps=6, max_tokens=48, max_step_tokens=8, max_cut_steps=None))
    async def close():  # the engines are the test's: the server stops them at its shutdown
        await target.close()
        await draft.close()

    with serving({"stepspec": served}, start_timeout=600, close=close, max_concurrency=64) as url:
        sdk = sdk_client(url)
        warm = sdk.chat.completions.create(model="stepspec", messages=[{"role": "user", "content": Q}])
        assert warm.choices[0].finish_reason in ("stop", "length")

        async def one(i: int, http: httpx.AsyncClient) -> tuple[str, float]:
            long = {"stepspec": {"budget": {"max_steps": 400, "max_tokens": 3000}}} if i < 5 else {}
            body = {"model": "stepspec", "messages": [{"role": "user", "content": f"{Q} ({i})"}], "stream": True,
                    **long}
            t0 = time.perf_counter()
            events = []
            async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                    if i < 5 and len(events) == 1:  # the first step arrived: hang up
                        return "gone", time.perf_counter() - t0
            assert events[-1] == "[DONE]" and all(json.loads(e)["object"] == "chat.completion.chunk"
                                                  for e in events[:-1])
            return "done", time.perf_counter() - t0

        run_32_streams(one, 600, record_property)
        deadline = time.monotonic() + 5
        while target.num_unfinished_requests() or draft.num_unfinished_requests():
            assert time.monotonic() < deadline, "a hung-up trace's engine requests are still running in vLLM"
            time.sleep(0.05)
        with httpx.Client(timeout=10) as http:
            assert http.get(f"{url}/health").json()["in_flight"] == 0


def test_a_workflow_file_is_served_one_model_per_reasoner(tmp_path):
    from stepspec.workflows.flows.runner import WorkflowRun
    from stepspec.workflows.flows.schema import load_workflow

    path = tmp_path / "two.yaml"
    path.write_text("""\
engines:
  target: {backend: vllm, model: qwen2.5-coder-1.5b}
  draft: {backend: vllm, model: qwen2.5-coder-0.5b}
reasoners:
  careful: {target: target, strategy: target-only}
  quick: {target: target, draft: draft, strategy: draft-only}
""")
    engines = {"target": script(*TARGET_STEPS), "draft": script(*DRAFT_STEPS)}
    run = WorkflowRun(load_workflow(path), engines=engines)
    with serving(run.reasoners) as url:
        sdk = sdk_client(url)
        assert sorted(m.id for m in sdk.models.list().data) == ["careful", "quick"]
        ask = dict(messages=[{"role": "user", "content": Q}])
        assert sdk.chat.completions.create(model="careful", **ask).choices[0].message.content == TARGET_STEPS[2]
        assert sdk.chat.completions.create(model="quick", **ask).choices[0].message.content == ANSWER
        from openai import BadRequestError

        with pytest.raises(BadRequestError, match="'model' is required: this server serves careful, quick"):
            sdk.chat.completions.create(model="", **ask)


def test_lm_evals_local_chat_completions_scores_the_served_reasoner(tmp_path):
    """lm-eval's own API model (`local-chat-completions`) against the endpoint, on a local GSM8K task."""
    lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is in stepspec[eval]")
    from lm_eval.tasks import TaskManager

    from fake_engine import ScriptedEngine
    from stepspec.orchestrator.reasoner import Reasoner
    from scripted import local_task

    rows = [{"question": f"What is {i} + 10?", "answer": f"{i} + 10 = {i + 10}\n#### {i + 10}"} for i in range(4)]
    data = tmp_path / "gsm8k_test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def answer(prompt):
        i = int(prompt.split("What is ")[-1].split(" +")[0])
        return "Add ten.\n\n" if "Add ten." not in prompt else "\\boxed{%d}" % (i + 10)

    # backoff off: with two traces in flight the goodput governor could give one to the target in one
    # generation, where this script (a step per call) would write only its first step
    served = Reasoner(ScriptedEngine("target", continuation=answer), ScriptedEngine("draft", continuation=answer),
                      strategy="specreason", judge=FixedJudge(True), first_target_steps=0, backoff=False)
    with serving({"stepspec": served}) as url:
        out = lm_eval.simple_evaluate(
            model="local-chat-completions", apply_chat_template=True, limit=3, log_samples=True,
            model_args={"model": "stepspec", "base_url": f"{url}/v1/chat/completions", "num_concurrent": 2,
                        "max_retries": 1, "tokenized_requests": False},
            tasks=["gsm8k_stepspec_tmp"], task_manager=TaskManager(include_path=str(local_task(tmp_path, data))))
    res = out["results"]["gsm8k_stepspec_tmp"]
    assert res["exact_match,boxed"] == 1.0
    assert [s["resps"][0][0] for s in out["samples"]["gsm8k_stepspec_tmp"] if s["filter"] == "boxed"] == [
        "\\boxed{10}", "\\boxed{11}", "\\boxed{12}"]


def test_a_server_killed_mid_stream_gives_the_client_a_clean_error_and_a_restarted_one_serves_again(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import openai

    port = free_port()
    url, log = f"http://127.0.0.1:{port}", tmp_path / "serve.log"
    script_path = Path(__file__).resolve().parents[1] / "support" / "serve_scripted.py"

    def start() -> subprocess.Popen:
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, str(script_path), str(port)], stdout=out, stderr=subprocess.STDOUT)
        wait_healthy(proc, url, log, timeout_s=120)
        return proc

    sdk = sdk_client(url)
    ask = dict(model="stepspec", messages=[{"role": "user", "content": Q}], stream=True)
    proc = start()
    try:
        stream = sdk.chat.completions.create(**ask)
        first = next(iter(stream))
        assert first.choices[0].delta.role == "assistant"
        stop_process(proc, crash=True)  # SIGKILL, as a crash would
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            list(stream)
        proc = start()
        reply = sdk.chat.completions.create(**{**ask, "stream": False})
        assert reply.choices[0].message.content == ANSWER
    finally:
        stop_process(proc)


