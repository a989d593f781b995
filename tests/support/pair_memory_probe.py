"""Everything a step-level strategy with draft-model token speculation holds at once,
measured in a fresh process, as a user's `stepspec` run has it.

Run by tests/engine/test_pair.py: ``python tests/support/pair_memory_probe.py OUT`` reads
``{"target": path, "draft": path, "prompt": ..., "max_tokens": ...}`` as JSON on stdin,
starts the 0.5B draft engine, the 1.5B target engine with the 0.5B drafting its tokens,
and the embedder; generates once on each engine while all three are alive; writes one
JSON object to OUT. test_pair.py also imports :func:`pair_engine`, the settings every
pair test runs an engine with.

Memory is the proportional set size (PSS) summed over this process and every process
under it: a page that n processes share (libtorch, the Python runtime) counts 1/n in
each, so the sum is the physical memory the run takes. Summed RSS counts such a page
once per process (about 0.15 GiB per vLLM process here). A fresh process, because a
pytest process that ran a few hundred tests before holds memory no user's run has.
"""

import asyncio
import json
import sys

from stepspec.engine.models import BUNDLED_EMBEDDING, resolve_model
from stepspec.engine.speculation import speculative_config
from stepspec.engine.types import GenerationRequest, Sampling
from stepspec.engine.vllm_backend import VLLMEngine

DRAFT_TOKENS = 8


def pair_engine(path: str, name: str, spec: dict | None = None, **kw) -> VLLMEngine:
    # Eager mode: the same kernels with and without speculation, and no
    # torch.compile warm-up per engine (tens of seconds each on two cores).
    return VLLMEngine(
        path, name=name, max_model_len=2048, kv_cache_gib=0.5, speculative_config=spec,
        engine_args={"enforce_eager": True}, **kw,
    )


def memory_bytes() -> tuple[int, int]:
    """(PSS, RSS) summed over this process and its descendants, in bytes."""
    import psutil  # ships with vLLM

    me = psutil.Process()
    pss = rss = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        pss, rss = pss + info.pss, rss + info.rss
    return pss, rss


async def probe(target_path: str, draft_path: str, prompt: str, max_tokens: int) -> dict:
    draft = pair_engine(draft_path, "draft")
    target = pair_engine(target_path, "target+draft", speculative_config("draft", draft_model=draft_path))
    await draft.start()
    await target.start()
    try:
        from sentence_transformers import SentenceTransformer

        embedder = SentenceTransformer(resolve_model(BUNDLED_EMBEDDING), device="cpu")
        embedding_shape = list(embedder.encode(["16 - 3 - 4 = 9"]).shape)
        (t,) = await target.generate([GenerationRequest(prompt, Sampling(max_tokens=max_tokens))])
        (d,) = await draft.generate([GenerationRequest(prompt, Sampling(max_tokens=DRAFT_TOKENS))])
        pss, rss = memory_bytes()  # everything alive at once
        target_stats, draft_stats = target.stats(), draft.stats()
    finally:
        await target.close()
        await draft.close()
    return {
        "target_token_ids": list(t.completion.token_ids),
        "target_spec_decoding": t.completion.spec_decoding.to_dict() if t.completion.spec_decoding else None,
        "draft_num_output_tokens": d.completion.num_output_tokens,
        "embedding_shape": embedding_shape,
        "target_stats": target_stats.to_dict(),
        "draft_stats": draft_stats.to_dict(),
        "total_pss_bytes": pss,
        "total_rss_bytes": rss,
    }


if __name__ == "__main__":
    request = json.load(sys.stdin)
    result = asyncio.run(probe(request["target"], request["draft"], request["prompt"], request["max_tokens"]))
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
