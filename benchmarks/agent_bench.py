"""A reasoning agent against `stepspec serve`: GSM8K tasks solved by the OpenAI Agents SDK's
loop with a calculator tool, per arm (strategy), one task at a time and 8 at once.

Each arm gets its own server (cold caches). The SDK sends the tools, runs each call the
model makes and sends the result back until the model answers; every model request's
``stepspec`` stats are read from its response (an httpx hook), so each task's time splits
into the server's model time (drafting, the target's writing, verification) per turn, the
rest of the server's time, the tools' time and the client's. Success is graded by GSM8K's
grader on the final output, paired per task against target-only.

    python benchmarks/agent_bench.py --out benchmarks/measured/agent_gsm8k_cpu --start 0 --limit 50

Resumable: a task already in an arm's samples file is not run again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from served import cpu_model, start_server, stop_server  # noqa: E402
from workflows.eval.datasets import load_problems  # noqa: E402
from workflows.eval.graders import get_grader  # noqa: E402
from workflows.examples.tools import calculator as calculate  # noqa: E402

ARMS = ("target-only", "specreason", "draft-only")
INSTRUCTIONS = ("Solve the math word problem step by step. Use the calculator tool for every calculation, then "
                "wait for its result. Write the final answer as \\boxed{answer}.")


async def solve(url: str, question: str) -> dict:
    """One task through the SDK's loop: its output, seconds, and each request's stats and tool time."""
    import agents
    from openai import AsyncOpenAI

    turns: list[dict] = []
    tool_seconds: list[float] = []

    async def record(response: httpx.Response) -> None:
        if response.request.url.path.endswith("/chat/completions"):
            body = json.loads(await response.aread())
            turns.append({"prompt_tokens": body.get("usage", {}).get("prompt_tokens"),
                          "finish_reason": body["choices"][0]["finish_reason"] if body.get("choices") else None,
                          **{k: body.get("stepspec", {}).get(k) for k in (
                              "seconds", "model_seconds", "judge_seconds", "draft_seconds", "target_seconds",
                              "num_tokens", "num_target_tokens", "num_drafted_steps", "num_accepted_steps",
                              "tool_call_steps", "spec_decoding")}})

    @agents.function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression: + - * / ** ( ) and numbers."""
        t0 = time.perf_counter()
        try:
            return str(calculate(expression))
        except Exception as e:  # the model reads the error, as from any tool
            return f"error: {e}"
        finally:
            tool_seconds.append(time.perf_counter() - t0)

    agents.set_tracing_disabled(True)  # the SDK would export traces to OpenAI
    http = httpx.AsyncClient(timeout=600, event_hooks={"response": [record]})
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, http_client=http)
    model = agents.OpenAIChatCompletionsModel(model="stepspec", openai_client=client)
    agent = agents.Agent(name="math", instructions=INSTRUCTIONS, tools=[calculator], model=model)
    t0 = time.perf_counter()
    try:
        result = await agents.Runner.run(agent, question, max_turns=8)
        output, error = str(result.final_output), None
    except Exception as e:  # a task that fails is recorded as failed, with why
        output, error = "", f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    await http.aclose()
    return {"output": output, "error": error, "seconds": seconds, "turns": turns, "tool_seconds": sum(tool_seconds),
            "tool_calls": len(tool_seconds)}


async def run_mode(url: str, problems, done: set[int], concurrency: int, path: Path, arm: str, mode: str) -> None:
    grader = get_grader("gsm8k")
    gate = asyncio.Semaphore(concurrency)

    async def one(p) -> None:
        async with gate:
            r = await solve(url, p.question)
        r.update(index=p.index, arm=arm, mode=mode, gold=grader.gold(p.reference),
                 correct=bool(r["output"]) and grader.grade(r["output"], p.reference)["strict"].correct)
        with path.open("a") as f:
            f.write(json.dumps(r) + "\n")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(p) for p in problems if p.index not in done))
    with (path.parent / "walls.jsonl").open("a") as f:
        f.write(json.dumps({"arm": arm, "mode": mode, "seconds": time.perf_counter() - t0,
                            "tasks": [p.index for p in problems if p.index not in done]}) + "\n")


def samples(out: Path, arm: str, mode: str) -> dict[int, dict]:
    path = out / f"{arm}.{mode}.jsonl"
    return {r["index"]: r for r in map(json.loads, path.read_text().splitlines())} if path.exists() else {}


def report(out: Path, arms: list[str]) -> str:
    lines = ["# A reasoning agent (OpenAI Agents SDK, calculator tool) on GSM8K against `stepspec serve`", "",
             f"CPU: {cpu_model()}. Each arm its own server (cold caches); `one`: one task at a time, `8`: 8 at once.",
             "", "| arm | mode | tasks | solved | vs target-only: lost / gained / net loss | median s per task | "
             "speed vs target-only (median ratio one at a time; wall time 8 at once) | turns per task | tool calls |",
             "|---|---|---|---|---|---|---|---|---|"]
    walls = [json.loads(line) for line in (out / "walls.jsonl").read_text().splitlines()] \
        if (out / "walls.jsonl").exists() else []
    for mode in ("one", "8"):
        base = samples(out, "target-only", mode)
        for arm in arms:
            s = samples(out, arm, mode)
            if not s:
                continue
            paired = [i for i in s if i in base]
            lost = sum(base[i]["correct"] and not s[i]["correct"] for i in paired)
            gained = sum(s[i]["correct"] and not base[i]["correct"] for i in paired)
            if mode == "one":
                ratios = [base[i]["seconds"] / s[i]["seconds"] for i in paired]
                speed = f"{statistics.median(ratios):.2f}x" if ratios else "-"
            else:
                wall = {w["arm"]: w["seconds"] for w in walls if w["mode"] == mode}
                speed = f"{wall['target-only'] / wall[arm]:.2f}x" if arm in wall and "target-only" in wall else "-"
            vs = "baseline" if arm == "target-only" else f"{lost} / {gained} / {lost - gained}"
            lines.append(f"| {arm} | {mode} | {len(s)} | {sum(r['correct'] for r in s.values())} | {vs} | "
                         f"{statistics.median(r['seconds'] for r in s.values()):.1f} | {speed} | "
                         f"{statistics.mean(len(r['turns']) for r in s.values()):.1f} | "
                         f"{sum(r['tool_calls'] for r in s.values())} |")
    lines += ["", "Where a task's time goes, one at a time (sums over its turns, seconds per task, mean):", "",
              "| arm | task | server | model calls | drafting | target writing | verification | tools | "
              "prompt tokens per turn | tool-call steps drafted / kept |", "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        s = list(samples(out, arm, "one").values())
        if not s:
            continue

        def mean(key: str) -> float:
            return statistics.mean(sum(t.get(key) or 0 for t in r["turns"]) for r in s)

        prompts = [t["prompt_tokens"] for r in s for t in r["turns"] if t.get("prompt_tokens")]
        calls = [t["tool_call_steps"] for r in s for t in r["turns"] if t.get("tool_call_steps")]
        lines.append(f"| {arm} | {statistics.mean(r['seconds'] for r in s):.1f} | {mean('seconds'):.1f} | "
                     f"{mean('model_seconds'):.1f} | {mean('draft_seconds'):.1f} | {mean('target_seconds'):.1f} | "
                     f"{mean('judge_seconds'):.1f} | {statistics.mean(r['tool_seconds'] for r in s):.3f} | "
                     f"{statistics.mean(prompts) if prompts else 0:.0f} | "
                     f"{sum(c['drafted'] for c in calls)} / {sum(c['kept'] for c in calls)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--modes", default="one,8")
    p.add_argument("--port", type=int, default=8191)
    p.add_argument("--report", action="store_true", help="only rebuild report.md from the files")
    a = p.parse_args()
    arms = a.arms.split(",")
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.report:
        problems = load_problems("gsm8k")[a.start:a.start + a.limit]
        for arm in arms:
            server = start_server(["--strategy", arm, "--max-model-len", "8192"], a.port, a.out / f"serve-{arm}.log")
            try:
                for mode in a.modes.split(","):
                    path = a.out / f"{arm}.{mode}.jsonl"
                    asyncio.run(run_mode(f"http://127.0.0.1:{a.port}", problems, set(samples(a.out, arm, mode)),
                                         1 if mode == "one" else int(mode), path, arm, mode))
            finally:
                stop_server(server)
    (a.out / "report.md").write_text(report(a.out, arms))
    print((a.out / "report.md").read_text())


if __name__ == "__main__":
    main()
