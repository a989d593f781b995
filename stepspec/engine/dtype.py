"""Which dtype an in-process engine computes in, chosen per machine by measurement.

``dtype="auto"`` means: the fastest dtype this machine runs the model in.

* On a GPU, vLLM's own choice (``auto``: bfloat16 or float16 for a float32 checkpoint).
* On a CPU without native bf16 (no ``avx512_bf16`` and no ``amx_bf16`` flag), float32:
  bf16 is emulated there, and slower.
* On a CPU with native bf16, bfloat16 *if a short timed probe confirms it*: the model's
  MLP matrices (its own ``hidden_size`` x ``intermediate_size``) multiplied in float32 and
  in bfloat16 by vLLM's own CPU GEMM (the oneDNN or sgl kernel its linear layers use), one
  row at a time (decode: memory-bound, over more weight bytes than the caches hold) and
  256 rows at a time (prefill: compute-bound). bfloat16 wins when both run at least
  :data:`MIN_GAIN` times faster. The probe takes a few seconds, once per
  (CPU model, matrix shape, torch version): its result is cached in ``dtype_probe.json``
  beside the prepared models.

Worked example: on a CPU with ``amx_bf16`` the probe multiplies the 1.5B's shape
(1536 x 8960) both ways; if bfloat16 reads both the one-row and the 256-row product at least
:data:`MIN_GAIN` times faster, ``auto`` is bfloat16, and :class:`DtypeChoice` says so in the
run log and every bench report. On a CPU without the flags no probe runs: float32.

Importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from stepspec.engine.models import cache_dir

logger = logging.getLogger(__name__)

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic
MIN_GAIN = 1.1  # bfloat16 must be this much faster than float32, for decode and prefill both
PROBE_FILE = "dtype_probe.json"
# The probe's shape when a model has no readable config.json (a hub id): Qwen2.5-1.5B's.
DEFAULT_SHAPE = (1536, 8960)
_PROBING = threading.Lock()  # one probe at a time: two engines starting side by side would time each other


@dataclass(frozen=True)
class DtypeChoice:
    """What an engine computes in and why. ``requested``: as configured (``auto``, or a
    dtype given outright); ``dtype``: what vLLM is given; ``reason``: one sentence;
    ``probe``: the timed probe's figures, where one decided."""

    requested: str
    dtype: str
    reason: str
    cpu: str | None = None
    probe: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_info() -> tuple[str, tuple[str, ...]]:
    """(the CPU's model name, its native-bf16 flags) from /proc/cpuinfo ('unknown', () elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown", ()
    model, flags = "unknown", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, tuple(f for f in BF16_FLAGS if f in flags)


def model_shape(model: str) -> tuple[int, int]:
    """(hidden_size, intermediate_size) from a model folder's config.json (default: :data:`DEFAULT_SHAPE`)."""
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text())
        return int(config["hidden_size"]), int(config["intermediate_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_SHAPE


def choose_dtype(requested: str, model: str, *, cpu: bool) -> DtypeChoice:
    """The dtype an engine of ``model`` runs in: ``requested`` unless it is ``auto``
    (then the rules of this module's docstring)."""
    if requested != "auto":
        return DtypeChoice(requested, requested, f"{requested} as configured")
    if not cpu:
        return DtypeChoice("auto", "auto", "GPU: vLLM's own choice for the checkpoint")
    name, flags = cpu_info()
    if not flags:
        return DtypeChoice("auto", "float32", f"CPU '{name}' has no native bf16 ({' or '.join(BF16_FLAGS)}): "
                           "float32", cpu=name)
    probe = cached_probe(name, model_shape(model))
    faster = probe["decode_speedup"] >= MIN_GAIN and probe["prefill_speedup"] >= MIN_GAIN
    verdict = "bfloat16" if faster else "float32"
    return DtypeChoice("auto", verdict, f"CPU '{name}' has {', '.join(flags)}; the probe measured bfloat16 "
                       f"{probe['decode_speedup']:.2f}x (decode) and {probe['prefill_speedup']:.2f}x (prefill) "
                       f"the speed of float32: {verdict}", cpu=name, probe=probe)


def cached_probe(cpu: str, shape: tuple[int, int], path: Path | None = None) -> dict[str, Any]:
    """:func:`probe` for this CPU and shape, from the cache file if it ran before (else run and saved)."""
    import torch

    path = path or cache_dir() / PROBE_FILE
    key = f"{cpu} | {shape[0]}x{shape[1]} | torch {torch.__version__} | {torch.get_num_threads()} threads"
    with _PROBING:
        return _probe_once(path, key, shape)


def _probe_once(path: Path, key: str, shape: tuple[int, int]) -> dict[str, Any]:
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        logger.info("timing bfloat16 against float32 on this CPU (once per CPU and model shape): %s", key)
        known[key] = probe(*shape)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=2))
        os.replace(tmp, path)
    return known[key]


def probe(hidden: int, intermediate: int, *, decode_bytes: int = 768 << 20, prefill_rows: int = 256,
          repeats: int = 3) -> dict[str, Any]:
    """Seconds of float32 and bfloat16 matrix products of an MLP's shape through vLLM's CPU
    GEMM dispatch (what its linear layers run), and their ratios.

    Decode: one row through enough (intermediate x hidden) matrices to hold
    ``decode_bytes`` of float32 weights (more than the caches: the weights stream from
    memory, as in decoding; at most 64 matrices). Prefill: ``prefill_rows`` rows through two of them.
    Each is timed ``repeats`` times after a warm-up; the best time counts."""
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    torch.manual_seed(0)
    count = min(64, max(2, decode_bytes // (hidden * intermediate * 4)))  # a tiny model's: 64 small ones
    times: dict[str, dict[str, float]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        layers = []
        for _ in range(count):
            layer = torch.nn.Module()
            layer.weight = torch.nn.Parameter((torch.randn(intermediate, hidden) * 0.02).to(dtype),
                                              requires_grad=False)
            dispatch_cpu_unquantized_gemm(layer, remove_weight=True)  # sets layer.cpu_linear, as vLLM's layers
            layers.append(layer)
        row, rows = torch.randn(1, hidden).to(dtype), torch.randn(prefill_rows, hidden).to(dtype)
        times[str(dtype).removeprefix("torch.")] = {
            "decode": _best(lambda: [layer.cpu_linear(row, None, None) for layer in layers], repeats),
            "prefill": _best(lambda: [layer.cpu_linear(rows, None, None) for layer in layers[:2]], repeats)}
        del layers
    f32, bf16 = times["float32"], times["bfloat16"]
    return {"shape": [hidden, intermediate], "seconds": times,
            "decode_speedup": f32["decode"] / bf16["decode"], "prefill_speedup": f32["prefill"] / bf16["prefill"]}


def _best(fn, repeats: int) -> float:
    fn()  # warm-up: first-call costs (kernel selection, page faults) off the clock
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
