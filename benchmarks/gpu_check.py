"""GPU check of the vLLM path: bf16 decode throughput with and without token-level
speculation, greedy-output equality, and vLLM's acceptance counters.

Three subcommands; each writes JSON (``--json``) and prints a summary.

``make-models``: random-weight models from configs (no weights needed), saved in
the chosen dtype with a tokenizer, so the check runs where real weights cannot
be brought (e.g. the bundled pair's configs and tokenizer from the stepspec
cache)::

    python benchmarks/gpu_check.py make-models --target-config CFG_DIR \\
        --draft-config CFG_DIR --tokenizer-dir TOK_DIR --out /tmp/models

``bench``: one fresh vLLM ``LLM`` per speculation config, each in its own
process (so GPU memory is freed between them). Configs: ``none``, ``ngram``,
``draft`` (``--draft`` as draft model) and ``self`` (the target as its own
draft: ~100% acceptance, shows the mechanics). Per config: greedy tokens/s for a
single request and for a batch of ``--num-prompts``, the spec-decode counters
(``vllm:spec_decode_*`` from ``LLM.get_metrics()``) for each phase, and whether
the token ids equal those of ``none`` (from this run or ``--baseline-json``)::

    python benchmarks/gpu_check.py bench --model /tmp/models/target \\
        --draft /tmp/models/draft --configs none,ngram,draft,self \\
        --num-prompts 32 --max-tokens 256 --json out.json

``engine``: stepspec's own ``stepspec.engine.vllm_backend.VLLMEngine`` starts and runs a
short greedy generate, without and with ngram speculation; errors are recorded
as they are raised (``--patch-unknown-args`` drops engine arguments that this
vLLM does not know, to see whether the rest of the path works).

Without flashinfer installed, vLLM 0.26 fails at model load (its sampler check
imports the FlashInfer backend); ``VLLM_USE_FLASHINFER_SAMPLER=0`` avoids it and is
set here by default when flashinfer is missing.

Throughput counts generated tokens over the wall time of ``LLM.generate``
(prefill of the short prompts included); ``ignore_eos`` makes every request
produce exactly ``--max-tokens`` tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)

TOPICS = (
    "the sum of the first n odd numbers",
    "how many ways to climb n stairs taking 1 or 2 steps",
    "the greatest common divisor of two integers",
    "whether a string is a palindrome",
    "the number of primes below one hundred",
    "the area of a triangle with sides 3, 4 and 5",
    "the median of a list of numbers",
    "reversing a linked list in place",
)
STYLES = (
    "Explain step by step: {t}.",
    "Write a Python function for {t}, then test it.",
    "Solve and show your reasoning: {t}.",
    "Give a short proof or derivation about {t}.",
)


def make_prompts(n: int) -> list[str]:
    out = []
    for i in range(n):
        t = TOPICS[i % len(TOPICS)]
        s = STYLES[(i // len(TOPICS)) % len(STYLES)]
        out.append(f"Problem {i + 1}. " + s.format(t=t) + "\nAnswer:")
    return out


def spec_config(name: str, args) -> dict | None:
    k = args.num_spec_tokens
    if name == "none":
        return None
    if name == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if name == "draft":
        if not args.draft:
            raise SystemExit("config 'draft' needs --draft")
        return {"model": args.draft, "num_speculative_tokens": k}
    if name == "self":
        return {"model": args.model, "num_speculative_tokens": k}
    raise SystemExit(f"unknown config '{name}' (none, ngram, draft, self)")


# -- make-models ----------------------------------------------------------------------


def cmd_make_models(args) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(args.out)
    made = {}
    for role, cfg_dir in (("target", args.target_config), ("draft", args.draft_config)):
        if not cfg_dir:
            continue
        t0 = time.perf_counter()
        cfg = AutoConfig.from_pretrained(cfg_dir)
        for key in ("dtype", "torch_dtype"):
            setattr(cfg, key, args.dtype)
        torch.manual_seed(args.seed + (0 if role == "target" else 1))
        with torch.device(device):
            try:
                model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
            except TypeError:
                model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
        model = model.to(dtype)
        dest = out / role
        model.save_pretrained(dest)
        for name in TOKENIZER_FILES:
            src = Path(args.tokenizer_dir) / name
            if src.exists():
                shutil.copy(src, dest / name)
        n = sum(p.numel() for p in model.parameters())
        made[role] = {"path": str(dest), "params": n, "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{role}: {n / 1e9:.3f}B params, {args.dtype}, saved to {dest}", flush=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return made


# -- bench ----------------------------------------------------------------------------


def _spec_counters(llm) -> dict:
    """The cumulative vllm:spec_decode_* metrics of an LLM (counters and the per-position vector)."""
    out = {}
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:spec_decode"):
            continue
        name = m.name.removeprefix("vllm:spec_decode_").removesuffix("_total")
        if hasattr(m, "values"):
            prev = out.get(name, [0] * len(m.values))
            out[name] = [a + b for a, b in zip(prev, m.values)]
        elif hasattr(m, "value"):
            out[name] = out.get(name, 0) + m.value
    return out


def _delta(after: dict, before: dict) -> dict:
    d = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, list):
            b = b or [0] * len(v)
            d[k] = [x - y for x, y in zip(v, b)]
        else:
            d[k] = v - (b or 0)
    drafts, draft_tokens = d.get("num_drafts", 0), d.get("num_draft_tokens", 0)
    accepted = d.get("num_accepted_tokens", 0)
    if drafts:
        d["acceptance_rate"] = accepted / draft_tokens if draft_tokens else None
        d["mean_acceptance_length"] = 1 + accepted / drafts
        per_pos = d.get("num_accepted_tokens_per_pos")
        if per_pos:
            d["acceptance_rate_per_pos"] = [x / drafts for x in per_pos]
    return d


def bench_worker(args) -> dict:
    """Runs in its own process: one LLM, one speculation config."""
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    name = args.config
    spec = spec_config(name, args)
    t0 = time.perf_counter()
    kwargs = {
        "model": args.model,
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "max_num_seqs": max(args.num_prompts, 1),
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "seed": args.seed,
        "disable_log_stats": False,  # get_metrics() needs the stat loggers
        "enforce_eager": args.enforce_eager,
    }
    if spec:
        kwargs["speculative_config"] = spec
    for kv in args.llm_arg or []:  # extra LLM(...) arguments, KEY=JSON (or a bare string)
        key, _, value = kv.partition("=")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    llm = LLM(**kwargs)
    startup = time.perf_counter() - t0
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p, add_special_tokens=False) for p in make_prompts(args.num_prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)

    def run(batch):
        before = _spec_counters(llm)
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": ids} for ids in batch], params, use_tqdm=False)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t
        ids = [list(o.outputs[0].token_ids) for o in outs]
        n = sum(len(x) for x in ids)
        return {
            "requests": len(batch),
            "output_tokens": n,
            "seconds": round(seconds, 4),
            "tokens_per_s": round(n / seconds, 1),
            "spec": _delta(_spec_counters(llm), before) if spec else None,
            "token_ids": ids,
        }

    # Warm-up, so first-call costs land on no measured phase.
    llm.generate([{"prompt_token_ids": ids} for ids in prompts[:2]],
                 SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    single = [run(prompts[i:i + 1]) for i in range(min(args.single_runs, len(prompts)))]
    batch = run(prompts)
    result = {
        "config": name,
        "speculative_config": spec,
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "startup_s": round(startup, 1),
        "single": single,
        "batch": batch,
    }
    return result  # the worker process exits next, which shuts the engine down


def _first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _compare(res: dict, base: dict) -> dict:
    """Token-id equality of each phase's outputs against the baseline's."""
    out = {}
    pairs = [(f"single[{i}]", s, b) for i, (s, b) in enumerate(zip(res["single"], base["single"]))]
    pairs.append(("batch", res["batch"], base["batch"]))
    for label, r, b in pairs:
        diffs = [_first_diff(x, y) for x, y in zip(r["token_ids"], b["token_ids"])]
        bad = [(i, d) for i, d in enumerate(diffs) if d is not None]
        out[label] = {
            "identical": len(diffs) - len(bad),
            "of": len(diffs),
            "first_divergences": bad[:8],  # (request index, first differing token position)
        }
    return out


def cmd_bench(args) -> dict:
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    results: dict = {"args": {k: v for k, v in vars(args).items() if k != "func"}, "configs": {}}
    base = None
    if args.baseline_json:
        prev = json.loads(Path(args.baseline_json).read_text())
        base = prev.get("configs", {}).get("none")
    tmp = Path(args.workdir)
    tmp.mkdir(parents=True, exist_ok=True)
    for name in configs:
        out_file = tmp / f"gpu_check_{name}.json"
        out_file.unlink(missing_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "_worker", "--config", name,
               "--worker-json", str(out_file)] + _forward(args)
        print(f"=== {name}: {' '.join(cmd[2:])}", flush=True)
        t = time.perf_counter()
        proc = subprocess.run(cmd, timeout=args.config_timeout, check=False)
        wall = time.perf_counter() - t
        if proc.returncode != 0 or not out_file.exists():
            results["configs"][name] = {"error": f"worker exited {proc.returncode}", "wall_s": round(wall, 1)}
            print(f"=== {name}: FAILED (exit {proc.returncode})", flush=True)
            continue
        res = json.loads(out_file.read_text())
        res["wall_s"] = round(wall, 1)
        results["configs"][name] = res
        if name == "none":  # this run's own baseline wins over --baseline-json
            base = res
        _print_config(res)
    for name, res in results["configs"].items():
        if name != "none" and base is not None and "error" not in res:
            res["equal_to_none"] = _compare(res, base)
    _print_summary(results)
    return results


def _forward(args) -> list[str]:
    out = ["--model", args.model, "--dtype", args.dtype, "--num-prompts", str(args.num_prompts),
           "--max-tokens", str(args.max_tokens), "--num-spec-tokens", str(args.num_spec_tokens),
           "--max-model-len", str(args.max_model_len), "--gpu-memory-utilization",
           str(args.gpu_memory_utilization), "--seed", str(args.seed), "--single-runs", str(args.single_runs)]
    if args.draft:
        out += ["--draft", args.draft]
    if args.enforce_eager:
        out.append("--enforce-eager")
    for kv in args.llm_arg or []:
        out += ["--llm-arg", kv]
    return out


def _fmt_spec(s: dict | None) -> str:
    if not s or not s.get("num_drafts"):
        return "-"
    return (f"drafts={s['num_drafts']} draft_tok={s['num_draft_tokens']} acc_tok={s['num_accepted_tokens']} "
            f"acc_rate={s['acceptance_rate']:.3f} mean_acc_len={s['mean_acceptance_length']:.2f}")


def _print_config(res: dict) -> None:
    s1 = res["single"][0] if res["single"] else None
    print(f"--- {res['config']}: startup {res['startup_s']} s", flush=True)
    if s1:
        print(f"    batch 1:  {s1['tokens_per_s']} tok/s ({s1['output_tokens']} tok in {s1['seconds']} s)  "
              f"{_fmt_spec(s1['spec'])}", flush=True)
    b = res["batch"]
    print(f"    batch {b['requests']}: {b['tokens_per_s']} tok/s ({b['output_tokens']} tok in {b['seconds']} s)  "
          f"{_fmt_spec(b['spec'])}", flush=True)


def _print_summary(results: dict) -> None:
    print("\n=== summary", flush=True)
    for name, res in results["configs"].items():
        if "error" in res:
            print(f"{name:6s} ERROR {res['error']}")
            continue
        single = res["single"]
        tps1 = sum(s["tokens_per_s"] for s in single) / len(single) if single else float("nan")
        eq = res.get("equal_to_none")
        eq_s = "" if eq is None else "  equal-to-none: " + ", ".join(
            f"{k} {v['identical']}/{v['of']}" for k, v in eq.items())
        print(f"{name:6s} b1 {tps1:8.1f} tok/s  b{res['batch']['requests']} {res['batch']['tokens_per_s']:9.1f} tok/s"
              f"  [b1 {_fmt_spec(single[0]['spec'] if single else None)}] "
              f"[bN {_fmt_spec(res['batch']['spec'])}]{eq_s}", flush=True)


# -- engine ---------------------------------------------------------------------------


def cmd_engine(args) -> dict:
    import asyncio

    sys.path.insert(0, str(REPO))
    from stepspec.engine.types import GenerationRequest, Sampling
    from stepspec.engine.vllm_backend import VLLMEngine

    if args.patch_unknown_args:
        import dataclasses

        import vllm.engine.arg_utils as au

        orig = au.AsyncEngineArgs
        known = {f.name for f in dataclasses.fields(orig)}

        class _Filtered(orig):  # drops (and reports) arguments this vLLM does not have
            def __init__(self, **kw):
                dropped = sorted(set(kw) - known)
                if dropped:
                    print(f"[patch] dropping unknown vLLM engine args: {dropped}", flush=True)
                super().__init__(**{k: v for k, v in kw.items() if k in known})

        au.AsyncEngineArgs = _Filtered

    async def one(spec_name: str) -> dict:
        spec = spec_config(spec_name, args)
        eng = VLLMEngine(args.model, name=f"gpu-check[{spec_name}]", dtype=args.dtype,
                         max_model_len=args.max_model_len, kv_cache_gib=args.kv_cache_gib,
                         speculative_config=spec)
        rec: dict = {"spec": spec_name}
        try:
            t = time.perf_counter()
            await eng.start()
            rec["startup_s"] = round(time.perf_counter() - t, 1)
            reqs = [GenerationRequest(p, Sampling(max_tokens=args.max_tokens, temperature=0.0))
                    for p in make_prompts(args.num_prompts)]
            t = time.perf_counter()
            res = await eng.generate(reqs)
            secs = time.perf_counter() - t
            n = sum(len(r.completion.token_ids) for r in res)
            rec.update(
                ok=True,
                output_tokens=n,
                seconds=round(secs, 3),
                tokens_per_s=round(n / secs, 1),
                finish_reasons=[str(r.completion.finish_reason) for r in res],
                first_text=res[0].completion.text[:80],
                per_request_spec=[None if r.completion.spec_decoding is None else
                                  vars(r.completion.spec_decoding) for r in res[:2]],
                engine_spec_stats=vars(eng.stats().spec_decoding),
            )
        except Exception as e:  # noqa: BLE001 - record the exact failure
            rec.update(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
        finally:
            try:
                await eng.close()
            except Exception as e:  # noqa: BLE001 - diagnostic only
                rec["close_error"] = f"{type(e).__name__}: {e}"
        print(json.dumps({k: v for k, v in rec.items() if k != "traceback"}, default=str), flush=True)
        if not rec.get("ok"):
            print(rec.get("traceback", ""), flush=True)
        return rec

    async def main():
        return [await one(s) for s in args.engine_specs.split(",")]

    return {"engine_runs": asyncio.run(main())}


# -- cli ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("make-models", help="random-weight target/draft models from configs")
    m.add_argument("--target-config", required=True, help="folder with config.json")
    m.add_argument("--draft-config", help="folder with config.json")
    m.add_argument("--tokenizer-dir", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--dtype", default="bfloat16")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--json")
    m.set_defaults(func=cmd_make_models)

    def common(q):
        q.add_argument("--model", required=True, help="target model folder or hub id")
        q.add_argument("--draft", help="draft model for config 'draft'")
        q.add_argument("--dtype", default="bfloat16")
        q.add_argument("--num-prompts", type=int, default=32, help="batch size of the batch phase")
        q.add_argument("--max-tokens", type=int, default=256)
        q.add_argument("--num-spec-tokens", type=int, default=3)
        q.add_argument("--max-model-len", type=int, default=2048)
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--json", help="write results here")
        q.add_argument("--llm-arg", action="append", metavar="KEY=JSON",
                       help="extra vLLM LLM() argument, e.g. async_scheduling=false (repeatable)")

    b = sub.add_parser("bench", help="throughput / acceptance / equality per speculation config")
    common(b)
    b.add_argument("--configs", default="none,ngram,draft,self")
    b.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    b.add_argument("--single-runs", type=int, default=1, help="single-request runs (prompts 0..n-1)")
    b.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs / torch.compile")
    b.add_argument("--baseline-json", help="earlier bench JSON whose 'none' is the equality baseline")
    b.add_argument("--workdir", default="/tmp/gpu_check")
    b.add_argument("--config-timeout", type=int, default=900)
    b.set_defaults(func=cmd_bench)

    w = sub.add_parser("_worker")  # internal: one config in its own process
    common(w)
    w.add_argument("--config", required=True)
    w.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    w.add_argument("--single-runs", type=int, default=1)
    w.add_argument("--enforce-eager", action="store_true")
    w.add_argument("--worker-json", required=True)
    w.set_defaults(func=None)

    e = sub.add_parser("engine", help="stepspec's VLLMEngine: start + short greedy generate")
    common(e)
    e.set_defaults(num_prompts=2, max_tokens=32, func=cmd_engine)
    e.add_argument("--engine-specs", default="none,ngram", help="comma list of none/ngram/draft/self")
    e.add_argument("--kv-cache-gib", type=float, default=2.0)
    e.add_argument("--patch-unknown-args", action="store_true",
                   help="drop engine args this vLLM lacks (diagnostic, not a fix)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("flashinfer") is None:
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    if args.cmd == "_worker":
        res = bench_worker(args)
        Path(args.worker_json).write_text(json.dumps(res))
        return 0
    res = args.func(args)
    if getattr(args, "json", None):
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
        print(f"wrote {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
