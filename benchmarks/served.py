"""`stepspec serve` for a benchmark: started on a port of its own, waited for, stopped with its engines.

    server = start_server(["--strategy", "specreason"], port=8190, log=Path("serve.log"))
    ...
    stop_server(server)
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def start_server(args: list[str], port: int, log: Path, timeout_s: float = 900) -> subprocess.Popen:
    """``stepspec serve ARGS --port PORT``, once it answers /health (see :func:`start_process`)."""
    return start_process([str(ROOT / ".venv" / "bin" / "stepspec"), "serve", *args, "--port", str(port)], port, log,
                         timeout_s=timeout_s)


def engine_env() -> dict[str, str]:
    """The environment a server's engines run in: offline, on 127.0.0.1, Intel OpenMP first, OpenMP threads
    on every core the process may run on (as stepspec's own engines start; vLLM's server left to its
    "auto" binding keeps one core for its API process, so on 2 cores its engine runs on one)."""
    from stepspec.engine.vllm_runtime import allowed_cpus, ld_preload_with_intel_openmp

    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_HOST_IP="127.0.0.1")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", allowed_cpus())
    if preload := ld_preload_with_intel_openmp(env.get("LD_PRELOAD")):
        env["LD_PRELOAD"] = preload
    return env


def start_vllm_server(model: str, served_name: str, port: int, log: Path, *, dtype: str, max_model_len: int,
                      kv_cache_gib: float, speculative_config: dict | None, args: tuple[str, ...] | list[str] = ()
                      ) -> subprocess.Popen:
    """vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``) on ``model``, serving
    ``served_name``, with the KV cache given in bytes (the CPU build's default asks for 92% of the
    machine's memory), once it answers /health; ``args``: more of its flags."""
    import json
    import sys

    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name",
           served_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len",
           str(max_model_len), "--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30)),
           *(["--speculative-config", json.dumps(speculative_config)] if speculative_config else []), *args]
    return start_process(cmd, port, log, engine_env())


def start_process(cmd: list[str], port: int, log: Path, env: dict[str, str] | None = None,
                  timeout_s: float = 900) -> subprocess.Popen:
    """A server ``cmd`` in a process group of its own, once it answers /health on ``port``.
    A server already answering there is an error: each arm is measured on its own server."""
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    except httpx.HTTPError:
        pass  # nothing there: the port is ours
    else:
        raise RuntimeError(f"a server already answers on port {port}: stop it (or pass another --port)")
    with open(log, "ab") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(cmd[:4])} exited with {process.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(2)
    stop_server(process)
    raise RuntimeError(f"{' '.join(cmd[:4])} did not answer /health within {timeout_s:g} s; see {log}")


def stop_server(process: subprocess.Popen) -> None:
    """Stop the server and its engine processes (its whole process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def cpu_model() -> str:
    """lscpu's model name (every figure is recorded with it)."""
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"
