"""`stepspec serve` against vLLM's own OpenAI server, the same client, the same problems.

(a) vLLM's server (`python -m vllm.entrypoints.openai.api_server`) serving the target (the
1.5B) with its fastest token-level method on this machine for the mode (under load: suffix
decoding, `benchmarks/measured/gsm8k100_speed_2026-12-03_cpu`; one at a time: the 0.5B drafting
inside it, what stepspec's target-only arm uses, `benchmarks/measured/engines_cpu`) and the
dtype stepspec chooses for it; (b) `stepspec serve` with its defaults (the bundled pair,
specreason). Each arm is a fresh server process for each mode (cold caches: suffix decoding
keeps earlier outputs), started, measured and stopped by its PID before the next; the client is
the openai SDK (AsyncOpenAI), the prompt the reasoning prompt stepspec's traces open with,
greedy, the same token budget. Concurrently: every problem at once; one at a time: the first
``--latency-limit`` problems in turn. Accuracy is graded by the bench's GSM8K grader and
paired on the same problems.

Each mode is a wave: results.json is written after each (arm, mode), and a later run keeps the
modes already measured with the same settings (``--modes`` picks which to run).

    python benchmarks/serve_compare.py --limit 30 --latency-limit 30 --out benchmarks/measured/serve_gsm8k30_cpu
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stepspec.engine.dtype import choose_dtype, cpu_info  # noqa: E402
from stepspec.engine.models import BUNDLED_DRAFT, BUNDLED_TARGET, resolve_model  # noqa: E402
from stepspec.engine.speculation import speculative_config  # noqa: E402
from served import engine_env, start_process, start_vllm_server, stop_server  # noqa: E402 (benchmarks/: the script's own folder)
from stepspec.orchestrator.prompts import reasoning_messages  # noqa: E402
from stepspec.orchestrator.strategies import STRATEGIES  # noqa: E402
from stepspec.workflows.eval.datasets import load_dataset  # noqa: E402
from stepspec.workflows.eval.graders import get_grader  # noqa: E402


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def ask(client, model: str, messages: list[dict], max_tokens: int) -> dict:
    t0 = time.perf_counter()
    reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                 temperature=0)
    message = reply.choices[0].message
    text = (message.model_extra or {}).get("reasoning_content", "") + (message.content or "")
    return {"seconds": time.perf_counter() - t0, "text": text, "tokens": reply.usage.completion_tokens,
            "stepspec": (reply.model_extra or {}).get("stepspec")}


async def measure(url: str, model: str, problems, messages_of, max_tokens: int, concurrent: bool) -> dict:
    """One mode on a fresh server: every problem at once, or one at a time."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=3600)
    await ask(client, model, messages_of("What is 2 + 3?"), 32)  # first-call costs off the clock
    t0 = time.perf_counter()
    if concurrent:
        requests = await asyncio.gather(*(ask(client, model, messages_of(p.question), max_tokens) for p in problems))
    else:
        requests = [await ask(client, model, messages_of(p.question), max_tokens) for p in problems]
    wall = time.perf_counter() - t0
    await client.close()
    return {"wall_seconds": wall, "requests": requests}


def summary(runs: dict, problems, grader) -> dict:
    out = {}
    for arm, run in runs.items():
        out[arm] = {}
        for mode in run:
            reqs = run[mode]["requests"]
            right = [grader.grade(r["text"], p.reference)[grader.metrics[0]].correct for r, p in zip(reqs, problems)]
            for r, ok in zip(reqs, right):
                r["correct"] = ok
            seconds = sorted(r["seconds"] for r in reqs)
            out[arm][mode] = {"n": len(reqs), "solved": sum(right), "p50_s": statistics.median(seconds),
                              "p90_s": seconds[int(0.9 * (len(seconds) - 1))],
                              "wall_seconds": run[mode]["wall_seconds"]}
    return out


MODES = ("concurrent", "one_at_a_time")


def report(result: dict) -> str:
    s, base = result["summary"], "vllm-server"
    lines = ["# `stepspec serve` against vLLM's own server, GSM8K", "",
             f"CPU: {result['cpu']}; target dtype {result['target_dtype']}; `stepspec serve` at its defaults; "
             f"max_tokens {result['max_tokens']}, greedy. vLLM's server speculates with, per mode: "
             + "; ".join(f"{mode}: `{json.dumps(result['modes'][mode]['vllm_speculation'])}`" for mode in s[base])
             + ". Each mode is one run, both arms side by side (" + "; ".join(
                 f"{mode}: {m['date']}, commit {m['commit']}" for mode, m in result["modes"].items()) + ").", "",
             "| arm | mode | n | solved | vs vLLM server: lost / gained | wall s | speed vs vLLM server | p50 s | p90 s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm, modes in s.items():
        for mode, m in modes.items():
            b = s[base][mode]
            mine = [r["correct"] for r in result["runs"][arm][mode]["requests"]]
            theirs = [r["correct"] for r in result["runs"][base][mode]["requests"]]
            lost = sum(t and not o for o, t in zip(mine, theirs))
            gained = sum(o and not t for o, t in zip(mine, theirs))
            lines.append(f"| {arm} | {mode} | {m['n']} | {m['solved']}/{m['n']} | "
                         f"{'-' if arm == base else f'{lost} / {gained}'} | {m['wall_seconds']:.0f} | "
                         f"{b['wall_seconds'] / m['wall_seconds']:.2f}x | {m['p50_s']:.1f} | {m['p90_s']:.1f} |")
    return "\n".join(lines) + "\n"


def vllm_speculation(mode: str, draft: str) -> dict:
    """vLLM's server at its fastest for the mode: suffix decoding under load, the draft model
    inside the target one at a time (as stepspec's own target-only arm)."""
    if mode == "concurrent":
        return speculative_config("suffix")
    return speculative_config(STRATEGIES["target-only"].target_spec, draft_model=draft)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--latency-limit", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=640)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--modes", default=",".join(MODES), help="which modes to run now (comma-separated); "
                        "the others are kept from results.json when their settings match")
    parser.add_argument("--out", default="benchmarks/measured/serve_gsm8k30_cpu")
    args = parser.parse_args()
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    wanted = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := sorted(set(wanted) - set(MODES)):
        raise SystemExit(f"--modes: unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    problems = load_dataset("gsm8k").problems[:args.limit]
    sizes = {"concurrent": args.limit, "one_at_a_time": args.latency_limit}
    grader = get_grader("gsm8k")
    target, draft = resolve_model(BUNDLED_TARGET), resolve_model(BUNDLED_DRAFT)
    dtype = choose_dtype("auto", target, cpu=True).dtype
    env = engine_env()
    result = {"cpu": cpu_info()[0], "target_dtype": dtype, "max_tokens": args.max_tokens,
              "runs": {"vllm-server": {}, "stepspec-serve": {}}, "modes": {}}
    saved = out / "results.json"
    if saved.exists():
        old = json.loads(saved.read_text())
        for mode, m in old.get("modes", {}).items():
            same = (old["max_tokens"] == args.max_tokens and m["n"] == sizes[mode] and old["cpu"] == result["cpu"]
                    and mode not in wanted)
            if same:
                result["modes"][mode] = m
                for arm in result["runs"]:
                    result["runs"][arm][mode] = old["runs"][arm][mode]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()

    def save() -> None:
        done = [m for m in MODES if m in result["modes"]]
        result["summary"] = summary({arm: {m: r[m] for m in done} for arm, r in result["runs"].items()},
                                    problems, grader)
        saved.write_text(json.dumps(result, indent=1))
        (out / "report.md").write_text(report(result))

    # Each arm and mode on a fresh server process: no prefix cache and no suffix tree carries over.
    for mode in (m for m in MODES if m in wanted):
        subset = problems[:sizes[mode]]
        if not subset:
            continue
        spec = vllm_speculation(mode, draft)
        port = free_port()
        proc = start_vllm_server(target, "target", port, out / "vllm_server.log", dtype=dtype, max_model_len=4096,
                                 kv_cache_gib=args.kv_cache_gib, speculative_config=spec)
        try:
            base = asyncio.run(measure(f"http://127.0.0.1:{port}", "target", subset, reasoning_messages,
                                       args.max_tokens, mode == "concurrent"))
        finally:
            stop_server(proc)
        port = free_port()
        serve_cmd = [sys.executable, "-c", "from stepspec.workflows.cli.app import main; main()", "serve", "--port", str(port),
                     "--kv-cache-gib", str(args.kv_cache_gib), "--max-tokens", str(args.max_tokens)]
        proc = start_process(serve_cmd, port, out / "stepspec_serve.log", env)
        try:
            served = asyncio.run(measure(
                f"http://127.0.0.1:{port}", "stepspec", subset, lambda q: [{"role": "user", "content": q}],
                args.max_tokens, mode == "concurrent"))
        finally:
            stop_server(proc)
        result["runs"]["vllm-server"][mode], result["runs"]["stepspec-serve"][mode] = base, served
        result["modes"][mode] = {"n": len(subset), "vllm_speculation": spec, "commit": commit,
                                 "date": time.strftime("%Y-%m-%d")}
        save()
        print(report(result), flush=True)


if __name__ == "__main__":
    main()
