"""A real vLLM OpenAI-compatible server for the ``server`` tests: a free port, the server
started on a (tiny) model, waited for until healthy, and stopped by its PID, its engine
subprocesses included, gracefully or as a crash would (SIGKILL).

Only for tests marked ``vllm`` and ``server``; psutil comes with vLLM.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

# A start takes about a minute on an idle 2-core machine, several beside a busy one; a
# server that fails to start exits, and that is reported at once.
SERVER_START_TIMEOUT_S = 600.0


def free_port() -> int:
    """A TCP port nothing listens on now, on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sdk_client(url: str, key: str = "none"):
    """The openai SDK's client for a server at ``url`` (its /v1 routes), without retries."""
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def log_tail(path: Path, num_lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])


def start_vllm_server(model_path: str | Path, port: int, log: Path, *, served_name: str = "tiny",
                      max_model_len: int = 1024, kv_cache_gib: float = 1.0,
                      args: Sequence[str] = ()) -> subprocess.Popen:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1:``port`` (float32, eager,
    threads on every allowed core, Intel OpenMP), its output appended to ``log``; not yet healthy."""
    from stepspec.engine.vllm_runtime import allowed_cpus, ld_preload_with_intel_openmp

    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_HOST_IP="127.0.0.1", VLLM_CPU_OMP_THREADS_BIND=allowed_cpus())
    if preload := ld_preload_with_intel_openmp(env.get("LD_PRELOAD")):  # the OpenMP stepspec's engines run with
        env["LD_PRELOAD"] = preload
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_path), "--served-model-name", served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", str(max_model_len), "--enforce-eager",
        "--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30)), *args,
    ]  # fmt: skip
    with open(log, "ab") as log_file:  # a restarted server's lines follow the first one's
        return subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT)


def wait_healthy(proc: subprocess.Popen, base_url: str, log: Path, timeout_s: float = SERVER_START_TIMEOUT_S,
                 path: str = "/health") -> None:
    """Until ``base_url`` + ``path`` answers 200; a server that exits or takes longer than
    ``timeout_s`` fails the test with its log's tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server at {base_url} exited with {proc.returncode}:\n{log_tail(log)}")
        try:
            if httpx.get(f"{base_url}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not up yet
        time.sleep(0.5)
    pytest.fail(f"the server at {base_url} not healthy after {timeout_s:.0f}s:\n{log_tail(log)}")


def stop_process(proc: subprocess.Popen, *, crash: bool = False) -> None:
    """Stop the server by its PID (SIGTERM, or SIGKILL as a crash would: ``crash``), then
    any of its children that outlive it: after a SIGKILL, vLLM's engine subprocesses live on
    orphaned (and keep their memory), so they are terminated here."""
    import psutil

    if proc.poll() is not None:
        return
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    if crash:
        proc.kill()
    else:
        proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if crash:  # nobody tells them: end them as their server would have
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):  # already gone
                child.terminate()
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        child.kill()
    psutil.wait_procs(alive, timeout=10)


@contextlib.contextmanager
def vllm_server(model_path: str | Path, port: int, log: Path, **options) -> Iterator[subprocess.Popen]:
    """A healthy server (:func:`start_vllm_server` with ``options``), stopped on the way out
    whatever happened."""
    proc = start_vllm_server(model_path, port, log, **options)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", log)
        yield proc
    finally:
        stop_process(proc)


@contextmanager
def serving(reasoners, start_timeout: float = 30, close=None, **settings):
    """The app on a free port of 127.0.0.1, in a thread; yields its base URL once it serves
    (real engines start before it does: give them ``start_timeout``)."""
    import uvicorn

    from stepspec.workflows.serve.app import build_app
    from stepspec.workflows.serve.settings import ServeSettings

    port = free_port()
    app = build_app(reasoners, ServeSettings(port=port, **settings), close=close)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=120)
