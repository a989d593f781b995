"""Quiet by default: vLLM's lines go to a run log; the console gets them only when asked."""

import logging.config
import sys

import pytest

from stepspec.engine import logs


@pytest.fixture(autouse=True)
def vllm_logger_restored():
    """These tests configure the 'vllm' logger and stepspec's in this process: put them back as they were."""
    loggers = [logging.getLogger(name) for name in ("vllm", *logs.OWN_LOGGERS)]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, (handlers, level, propagate) in zip(loggers, saved):
        for handler in lg.handlers:
            if handler not in handlers:
                handler.close()
        lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate


def test_console_level_follows_verbosity_and_the_file_takes_everything(tmp_path):
    levels = [logs.logging_config(tmp_path / "x.log", v)["handlers"]["console"]["level"] for v in (0, 1, 2, 5)]
    assert levels == ["ERROR", "WARNING", "INFO", "INFO"]
    config = logs.logging_config(tmp_path / "x.log", 0)
    assert config["handlers"]["file"]["level"] == "INFO" and config["loggers"]["vllm"]["propagate"] is False


def test_the_config_routes_vllm_lines_to_the_file_and_only_errors_to_the_console(tmp_path, capsys):
    log_file = tmp_path / "run.log"
    logging.config.dictConfig(logs.logging_config(log_file, 0))
    vllm_logger = logging.getLogger("vllm.some.module")
    vllm_logger.info("engine started")
    vllm_logger.warning("Triton is not installed")
    vllm_logger.error("EngineCore died")
    err = capsys.readouterr().err
    assert "EngineCore died" in err and "Triton" not in err and "engine started" not in err
    text = log_file.read_text()
    assert all(m in text for m in ("engine started", "Triton is not installed", "EngineCore died"))


def test_stepspecs_own_info_lines_go_to_the_run_log(tmp_path, capsys):
    """What an engine computes in and why is an INFO line of stepspec's: in the run log always."""
    log_file = tmp_path / "run.log"
    logging.config.dictConfig(logs.logging_config(log_file, 0))
    logging.getLogger("stepspec.engine.vllm_backend").info("engine 'target': dtype bfloat16 (measured)")
    assert "dtype bfloat16 (measured)" in log_file.read_text()


def test_verbosity_is_the_larger_of_the_flags_and_the_environment(monkeypatch):
    monkeypatch.delenv(logs.VERBOSE_ENV, raising=False)
    assert logs.verbosity_from_env(0) == 0 and logs.verbosity_from_env(2) == 2
    monkeypatch.setenv(logs.VERBOSE_ENV, "1")
    assert logs.verbosity_from_env(0) == 1 and logs.verbosity_from_env(2) == 2
    monkeypatch.setenv(logs.VERBOSE_ENV, "loud")
    with pytest.raises(ValueError, match="STEPSPEC_VERBOSE='loud'.*0 \\(quiet\\)"):
        logs.verbosity_from_env(0)


def test_route_sets_up_every_process_and_log_tail_shows_the_end(tmp_path, monkeypatch):
    for var in ("VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_CONFIG_PATH", logs.LOG_ENV, logs.VERBOSE_ENV):
        monkeypatch.delenv(var, raising=False)
    stderr = sys.stderr
    log_file = logs.route_vllm_logs(tmp_path / "logs", 0)
    assert sys.stderr is stderr  # under pytest's capture stderr is not fd 2: nothing is redirected
    import json
    import os

    assert os.environ["VLLM_CONFIGURE_LOGGING"] == "1" and os.environ[logs.LOG_ENV] == str(log_file)
    config = json.loads(open(os.environ["VLLM_LOGGING_CONFIG_PATH"]).read())
    assert config["handlers"]["file"]["filename"] == str(log_file)
    assert logs.log_tail() == ""  # nothing logged yet
    log_file.write_text("".join(f"line {i}\n" for i in range(40)))
    tail = logs.log_tail(3)
    assert tail == f"\nlast lines of the engine log ({log_file}):\nline 37\nline 38\nline 39"


def test_old_run_logs_are_pruned_by_age_and_new_ones_kept(tmp_path, monkeypatch):
    import os
    import time

    monkeypatch.delenv(logs.LOG_ENV, raising=False)
    old, recent = tmp_path / "engine-old.log", tmp_path / "engine-recent.log"
    for path in (old, recent):
        path.write_text("x")
    week_ago = time.time() - (logs.KEEP_DAYS + 1) * 86400
    os.utime(old, (week_ago, week_ago))
    logs.route_vllm_logs(tmp_path, 0)
    assert not old.exists() and recent.exists()


@pytest.mark.vllm
def test_a_real_engine_is_quiet_and_a_failed_start_shows_the_logs_tail(tiny_model_path, tmp_path):
    """In a fresh process, as the CLI runs: nothing of vLLM's reaches the terminal; the run
    log holds it; an engine that cannot start says why with the log's last lines."""
    import subprocess

    script = f"""
import asyncio, sys
from pathlib import Path
from stepspec.engine.logs import route_vllm_logs
route_vllm_logs(Path({str(tmp_path)!r}), 0)
from stepspec.engine.protocol import EngineError
from stepspec.engine.types import GenerationRequest, Sampling
from stepspec.engine.vllm_backend import VLLMEngine

async def main():
    async with VLLMEngine({str(tiny_model_path)!r}, name="tiny", kv_cache_gib=0.1, max_model_len=256) as e:
        (r,) = await e.generate([GenerationRequest("1 + 1 =", Sampling(max_tokens=4))])
        print("generated", len(r.completions[0].token_ids) > 0)
    try:
        await VLLMEngine({str(tiny_model_path)!r}, name="huge", max_model_len=10**7).start()
    except EngineError as err:
        print("start failed:", err, file=sys.stderr)

if __name__ == "__main__":
    asyncio.run(main())
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                       cwd=str(tmp_path), env={**__import__("os").environ,
                                               "PYTHONPATH": __import__("os").getcwd()})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "generated True"
    (log_file,) = tmp_path.glob("engine-*.log")
    log = log_file.read_text()
    assert "Initializing a V1 LLM engine" in log and "force killing" not in log
    # the terminal got the failed start (with the log's tail) and nothing else of vLLM's
    assert "engine 'huge' could not start vLLM" in r.stderr and f"last lines of the engine log ({log_file})" in r.stderr
    before = r.stderr.split("start failed:")[0]
    assert before.strip() == "", before[-2000:]
