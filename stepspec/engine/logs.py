"""Where vLLM's own log lines go: a log file, and the console only when asked.

vLLM logs from the main process and from every engine subprocess (EngineCore,
workers), which inherit the environment. :func:`route_vllm_logs` writes a
Python logging config that every one of those processes loads (through
``VLLM_CONFIGURE_LOGGING``/``VLLM_LOGGING_CONFIG_PATH``): all of vLLM's lines at
INFO and above go to one log file per run, and the console gets only what the
verbosity asks for.

Verbosity 0 (the default): vLLM's ERRORs only; 1 (``-v``): its WARNINGs too; 2
(``-vv``): INFO too. At verbosity 0 the file also takes what the engine
processes write to stderr outside logging (tqdm bars, C++ and Python warnings,
prints before vLLM's logging is set up): file descriptor 2 points at the log,
and this process's ``sys.stderr`` stays on the terminal, so its own messages and
tracebacks still show. Errors are never hidden: an engine that fails to start or
dies says so with :func:`log_tail`, the last lines of the log file, in its
:class:`stepspec.engine.protocol.EngineError`.

Call it before vLLM is first imported in the process (the CLI does, first thing).
"""

from __future__ import annotations

import json
import logging.config
import os
import sys
import time
from collections import deque
from pathlib import Path

LOG_DIR_ENV = "STEPSPEC_LOG_DIR"  # where run logs go (default: the user cache dir's stepspec/logs)
LOG_ENV = "STEPSPEC_ENGINE_LOG"  # the log file of this run's engines (read by log_tail)
VERBOSE_ENV = "STEPSPEC_VERBOSE"  # 0, 1, 2: the verbosity when no -v is given
KEEP_DAYS = 7  # run logs older than this are removed (by age: a run still writing is never touched)

CONSOLE_LEVELS = ("ERROR", "WARNING", "INFO")
# stepspec's own loggers: their INFO lines (what each engine computes in and why, ...) go to the
# run log too; the console shows them by the verbosity, as vLLM's.
OWN_LOGGERS = ("stepspec",)


def verbosity_from_env(flag_count: int = 0) -> int:
    """The larger of ``-v`` given ``flag_count`` times and ``$STEPSPEC_VERBOSE``."""
    raw = os.environ.get(VERBOSE_ENV, "0").strip() or "0"
    try:
        env = int(raw)
    except ValueError:
        raise ValueError(f"{VERBOSE_ENV}={raw!r}: give 0 (quiet), 1 (vLLM warnings) or 2 (all vLLM logs)") from None
    return max(flag_count, env)


def log_dir() -> Path:
    """Where run logs go: $STEPSPEC_LOG_DIR, else the user cache dir's stepspec/logs."""
    env = os.environ.get(LOG_DIR_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("stepspec")) / "logs"


def logging_config(log_file: Path, verbosity: int) -> dict:
    """The dictConfig every vLLM process loads: file at INFO, console by verbosity."""
    console_level = CONSOLE_LEVELS[min(max(verbosity, 0), len(CONSOLE_LEVELS) - 1)]
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s [pid %(process)d %(name)s] %(message)s"}},
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": str(log_file), "mode": "a",
                     "formatter": "plain", "level": "INFO"},
            "console": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                        "formatter": "plain", "level": console_level},
        },
        "loggers": {"vllm": {"handlers": ["file", "console"], "level": "INFO", "propagate": False},
                    **{name: {"handlers": ["file"], "level": "INFO", "propagate": True} for name in OWN_LOGGERS}},
    }


def route_vllm_logs(log_dir: Path, verbosity: int) -> Path:
    """Send this process's and its engine subprocesses' vLLM logs to a new file in ``log_dir``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - KEEP_DAYS * 86400
    for old in log_dir.glob("engine-*.*"):
        try:
            if old.stat().st_mtime < cutoff:
                old.unlink()
        except FileNotFoundError:  # another run pruned it first
            pass
    log_file = log_dir / f"engine-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    config_file = log_file.with_suffix(".json")
    config_file.write_text(json.dumps(logging_config(log_file, verbosity)))
    os.environ["VLLM_CONFIGURE_LOGGING"] = "1"
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(config_file)
    os.environ[LOG_ENV] = str(log_file)
    os.environ[VERBOSE_ENV] = str(verbosity)
    if verbosity == 0:
        _stderr_fd_to(log_file)
    # This process's vLLM loggers now, not when vLLM applies the config: it logs some
    # lines on import before that (they would reach the terminal through the root logger).
    logging.config.dictConfig(logging_config(log_file, verbosity))
    if verbosity < 2:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TQDM_DISABLE", "1")
    return log_file


def _stderr_fd_to(log_file: Path) -> None:
    """Point fd 2 (inherited by engine subprocesses) at ``log_file``; keep ``sys.stderr``
    on the terminal. Only when ``sys.stderr`` is fd 2 itself (not under a test runner's capture)."""
    try:
        if sys.stderr is None or sys.stderr.fileno() != 2:
            return
    except (AttributeError, OSError, ValueError):
        return
    sys.stderr.flush()
    terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")
    fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = terminal


def log_tail(lines: int = 15) -> str:
    """The last ``lines`` lines of this run's engine log, headed by its path ('' if no log)."""
    path = os.environ.get(LOG_ENV)
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        tail = deque(f, maxlen=lines)
    if not tail:
        return ""
    return f"\nlast lines of the engine log ({path}):\n" + "".join(tail).rstrip()
