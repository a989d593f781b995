"""Scale-out as docs/serving.md runs it: two vLLM server replicas of the target, vllm-router
0.1.17 in front of them (``--worker-urls A B --policy cache_aware``), and ``stepspec serve
--target-url`` through the router, each a process of its own, on tiny models. A trace's requests
(its verifications and the target's steps, each extending the last) stay on one replica, and
traces of different questions reach both."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from openai_server import free_port, log_tail, start_vllm_server, stop_process, wait_healthy
from tiny_models import build_tiny_model

pytestmark = [pytest.mark.vllm, pytest.mark.server, pytest.mark.whole_machine]

QUESTIONS = ["How many clips did Natalia sell altogether in April and May?",
             "Weng earns $12 an hour for babysitting. How much did she earn?",
             "Step 1: 48 / 2 = 24. What is 48 + 24?",
             "Let me check: 12 / 60 = 0.2 per minute. What is 0.2 * 50?"]


def requests_served(url: str) -> int:
    """The completion requests a vLLM server finished (its ``vllm:request_success_total``)."""
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return round(sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:request_success_total")))


def test_two_replicas_behind_vllm_router_keep_a_trace_on_one_and_share_the_traces(tmp_path):
    router_bin = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
    target = build_tiny_model(tmp_path / "target", seed=0, weight_std=0.5, tie_word_embeddings=False)
    draft = build_tiny_model(tmp_path / "draft", seed=1, weight_std=0.5, tie_word_embeddings=False)
    ports = [free_port(), free_port()]
    replicas = [f"http://127.0.0.1:{p}" for p in ports]
    procs = []
    try:
        for port in ports:
            procs.append(start_vllm_server(target, port, tmp_path / f"replica{port}.log", served_name="target",
                                           max_model_len=1024, kv_cache_gib=0.25, args=["--max-logprobs", "20"]))
        for proc, url, port in zip(procs, replicas, ports):
            wait_healthy(proc, url, tmp_path / f"replica{port}.log")
        router_port = free_port()
        router_log = tmp_path / "router.log"
        with open(router_log, "ab") as out:  # docs/serving.md's command
            procs.append(subprocess.Popen([router_bin, "--port", str(router_port), "--worker-urls", *replicas,
                                           "--policy", "cache_aware"], stdout=out, stderr=subprocess.STDOUT))
        router = f"http://127.0.0.1:{router_port}"
        wait_healthy(procs[-1], router, router_log, timeout_s=120, path="/v1/models")
        serve_port, serve_log = free_port(), tmp_path / "serve.log"
        with open(serve_log, "ab") as out:  # docs/serving.md's command, on the tiny pair
            procs.append(subprocess.Popen(
                [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "serve",
                 "--port", str(serve_port), "--target-url", f"{router}/v1", "--target", "target",
                 "--draft", str(draft), "--max-tokens", "80", "--max-step-tokens", "16", "--kv-cache-gib", "0.25",
                 "--max-model-len", "1024"], stdout=out, stderr=subprocess.STDOUT))
        served = f"http://127.0.0.1:{serve_port}"
        wait_healthy(procs[-1], served, serve_log, timeout_s=300)

        def ask(question: str) -> dict:
            body = {"model": "stepspec", "max_tokens": 80, "messages": [{"role": "user", "content": question}]}
            r = httpx.post(f"{served}/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, (r.text, log_tail(serve_log))
            return r.json()

        before = [requests_served(url) for url in replicas]
        one = ask(QUESTIONS[0])
        after = [requests_served(url) for url in replicas]
        trace = [a - b for a, b in zip(after, before)]
        assert one["stepspec"]["num_drafted_steps"] >= 1  # the target wrote and verified: several requests
        assert sorted(trace)[0] == 0 and sorted(trace)[1] >= 3, trace  # all of them on one replica

        with ThreadPoolExecutor(len(QUESTIONS)) as pool:
            list(pool.map(ask, QUESTIONS))
        spread = [requests_served(url) - a for url, a in zip(replicas, after)]
        assert all(n > 0 for n in spread), spread  # the traces reach both replicas
    finally:
        for proc in reversed(procs):
            stop_process(proc)
