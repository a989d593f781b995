"""What binding a call to its tools' schemas costs each engine, by its parts: the grammar compile,
the per-token mask, and its interplay with the token-level speculation inside the engine.

For each engine of the served pair as specreason runs it (the draft, and the target on suffix
decoding), one at a time, greedy, batch 1: one chat request per question, the declared tools
rendered by the template (BFCL-style: two tools), the reply written in one generation up to
``--max-tokens`` tokens, first free (no binding) and then bound (``ToolCalling.constraint``: free
text until a call opens, then a declared call) on the same prompt, caches reset before each. A
tool set's first bound request compiles its grammar; ``first bound`` is that request, ``bound``
the same tool set again. Medians over the questions; tokens/s counts the tokens written.

    python benchmarks/bound_call_cost.py --json benchmarks/measured/bound_call_cost_cpu/costs.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from served import cpu_model  # noqa: E402

from stepspec.engine.config import EnginePair, build_engines  # noqa: E402
from stepspec.engine.speculation import TokenMethod  # noqa: E402
from stepspec.engine.types import GenerationRequest, Sampling  # noqa: E402
from stepspec.orchestrator.prompts import Chat  # noqa: E402
from stepspec.orchestrator.stepgen import opening_prompt  # noqa: E402
from stepspec.workflows.agents.toolcalls import ToolCalling  # noqa: E402


def tool(name: str, description: str, **properties: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": t} for k, t in properties.items()},
        "required": list(properties)}}}


TOOL_SETS = [
    [tool("get_weather", "The current weather in a city.", city="string", unit="string"),
     tool("convert_currency", "Convert an amount between currencies.", amount="number", source="string",
          target="string")],
    [tool("find_flights", "Flights between two airports on a date.", origin="string", destination="string",
          date="string"),
     tool("book_hotel", "Book a hotel room in a city for some nights.", city="string", nights="integer")],
]
QUESTIONS = [
    ["What's the weather in Lisbon in celsius?", "How much is 250 US dollars in euros?",
     "Is it raining in Oslo right now? Use fahrenheit.", "Convert 1200 yen to British pounds."],
    ["Find me flights from SFO to JFK on 2026-03-14.", "Book a hotel in Rome for three nights.",
     "Any flights from Paris CDG to Tokyo HND on 2026-05-02?", "I need a hotel in Berlin for 2 nights."],
]


async def measure(role: str, engine, max_tokens: int) -> dict:
    """Per arm (free, first bound, bound): median seconds, tokens and tokens/s over the questions."""
    await engine.start()
    rows: dict[str, list[tuple[float, int]]] = {"free": [], "first bound": [], "bound": []}
    texts: dict[str, list[str]] = {"free": [], "bound": []}
    await engine.generate([GenerationRequest("Hello", Sampling(max_tokens=4))])  # warm-up
    for tools, questions in zip(TOOL_SETS, QUESTIONS):
        calling = ToolCalling(tools, tokenizer=engine.tokenizer)
        for i, q in enumerate(questions):
            chat = Chat(q, [{"role": "user", "content": q}], calling.rendered_tools)
            prompt = await opening_prompt(engine, chat)
            for arm, structured in (("free", None), ("bound", calling.constraint)):
                await engine.reset_caches()
                t0 = time.perf_counter()
                (r,) = await engine.generate([GenerationRequest(prompt, Sampling(
                    max_tokens=max_tokens, temperature=0.0, stop=(calling.stop,), structured=structured))])
                seconds = time.perf_counter() - t0
                name = "first bound" if arm == "bound" and i == 0 else arm
                rows[name].append((seconds, r.completion.num_output_tokens))
                texts[arm].append(r.completion.text)
    out = {}
    for arm, values in rows.items():
        seconds, tokens = [s for s, _ in values], [n for _, n in values]
        out[arm] = {"median_s": statistics.median(seconds), "median_tokens": statistics.median(tokens),
                    "tok_per_s": sum(tokens) / sum(seconds), "n": len(values)}
    out["replies"] = {arm: t[:2] for arm, t in texts.items()}
    print(role, json.dumps({k: v for k, v in out.items() if k != "replies"}), flush=True)
    return out


async def main(out: Path | None, max_tokens: int) -> None:
    target_config, draft_config = EnginePair(kv_cache_gib=1.5).engines(TokenMethod.SUFFIX)
    result = {"cpu": cpu_model(), "max_tokens": max_tokens, "engines": {}}
    for role, config in (("draft", draft_config), ("target (suffix)", target_config)):
        engine = build_engines({"one": config})["one"]
        try:
            result["engines"][role] = await measure(role, engine, max_tokens)
        finally:
            await engine.close()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path)
    p.add_argument("--max-tokens", type=int, default=96)
    a = p.parse_args()
    asyncio.run(main(a.json, a.max_tokens))
