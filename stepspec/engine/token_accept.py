"""Judged token acceptance: the likelihood verifier's rule applied inside vLLM's token-level speculation.

Terms. Inside an engine with token-level speculation, a *proposer* (the draft model, n-gram,
suffix decoding) proposes ``k`` tokens; the target scores them in one forward pass and, for a
greedy request, keeps each proposed token while it equals the target's own greedy token (the
*exact* rule: the output is the target's greedy text). A *judged* rule keeps a proposed token
that is merely plausible to the target, as stepspec's ``likelihood`` verifier does for a drafted
step, but at every forward pass and without a call, a prompt-logprobs prefill or a Python object
per token:

* ``max_rank``: the token is among the target's ``max_rank`` most likely (1: the exact rule);
* ``floor``: and its target logprob is at least ``floor`` (None: no floor);
* ``math_max_rank``: and a token holding a digit or an arithmetic operator (:data:`MATH_TOKEN`)
  is among the target's ``math_max_rank`` most likely (None: no separate rule);
* ``math_target``: ``math_max_rank`` applies also where the target's own likeliest token holds one.

The first proposed token that is not kept is replaced by the target's greedy token, as in exact
verification; when all ``k`` are kept the target's next token follows (the bonus token).

Worked example, ``max_rank=2, floor=-3, math_max_rank=1``. After "She eats 3 eggs and bakes with",
the proposer offers " four", " muffins"; the target's likeliest are " 4" (-0.4) then " four"
(-1.5): " four" is rank 2 with logprob -1.5 and holds no digit, kept; the target's
likeliest next token after it is " muffins", kept; the bonus token follows. Had the proposer
offered " 5" (rank 2, a digit), it would be replaced by the target's " 4".

How. A ``vllm.general_plugins`` entry point (:func:`register`) wraps vLLM's rejection sampler in
every vLLM process: an engine whose vLLM config carries ``additional_config[ADDITIONAL_KEY]``
(an :class:`AcceptRule` as a mapping; :meth:`AcceptRule.vllm_config`) raises each greedy
request's kept proposed tokens to the top of the target's logits before the exact comparison,
so vLLM's own kernel does the rest. Logprobs the request asks for stay the target's raw ones.
Requests sampled at a temperature above 0 keep vLLM's speculative sampling. An engine without
the key is untouched.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pydantic import Field

from stepspec.common.options import Frozen

logger = logging.getLogger(__name__)

# A token whose text holds a digit or an arithmetic operator (the likelihood verifier's
# math_max_rank and the judged token rule's read it).
MATH_TOKEN = re.compile(r"[0-9+\-*/=×÷^<>%]")
# The key of vLLM's additional_config that carries an engine's rule.
ADDITIONAL_KEY = "stepspec_accept"


class AcceptRule(Frozen):
    """Which proposed tokens an engine's token-level speculation keeps for a greedy request."""

    max_rank: int = Field(1, ge=1, description="a proposed token is kept when it is among the target's max_rank "
                          "likeliest (1: only the target's greedy token, the exact rule: the target's greedy text)")
    floor: float | None = Field(None, lt=0, description="and its target logprob is at least this (None: no floor)")
    math_max_rank: int | None = Field(None, ge=1, description="and a token holding a digit or an arithmetic "
                                      "operator is among the target's math_max_rank likeliest (None: max_rank applies)")
    math_target: bool = Field(False, description="math_max_rank applies also where the target's likeliest token "
                              "holds a digit or operator")

    @property
    def exact(self) -> bool:
        """The rule keeps only the target's greedy token (vLLM's own verification)."""
        return self.max_rank == 1

    def vllm_config(self) -> dict[str, Any]:
        """vLLM's ``additional_config`` that carries the rule to the engine's worker (empty when exact)."""
        return {} if self.exact else {ADDITIONAL_KEY: self.model_dump()}


def judged_argmax_logits(target_logits: Any, draft_token_ids: Any, greedy_rows: Any, rule: AcceptRule,
                         math_ids: Any) -> int:
    """Raise each greedy row's proposed token above the row's maximum where ``rule`` keeps it, in
    place; returns how many rows it raised. ``target_logits`` [tokens, vocab] float32,
    ``draft_token_ids`` [tokens], ``greedy_rows`` [tokens] bool or None (all), ``math_ids`` a bool
    [vocab] mask of digit/operator tokens or None."""
    import torch

    ids = draft_token_ids.long()
    drafted = target_logits.gather(1, ids.unsqueeze(1))  # [tokens, 1]
    rank = (target_logits > drafted).sum(dim=1) + 1
    top, best = target_logits.max(dim=1)
    keep = (rank > 1) & (rank <= rule.max_rank)  # rank 1 is kept by vLLM's own comparison
    if rule.floor is not None:
        logprob = drafted.squeeze(1) - torch.logsumexp(target_logits, dim=1)
        keep &= logprob >= rule.floor
    if rule.math_max_rank is not None and math_ids is not None:
        numeric = math_ids[ids] | math_ids[best] if rule.math_target else math_ids[ids]
        keep &= ~numeric | (rank <= rule.math_max_rank)
    if greedy_rows is not None:
        keep &= greedy_rows
    rows = keep.nonzero().squeeze(1)
    if rows.numel():
        target_logits[rows, ids[rows]] = top[rows] + 1.0
    return int(rows.numel())


def math_token_mask(tokenizer_path: str, vocab_size: int) -> Any:
    """A bool [vocab_size] mask of the tokens whose text holds a digit or an arithmetic operator."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    n = min(len(tok), vocab_size)
    texts = tok.batch_decode([[i] for i in range(n)])
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[[i for i, t in enumerate(texts) if MATH_TOKEN.search(t)]] = True
    return mask


def register() -> None:
    """vLLM general-plugin hook: wrap the rejection sampler so an engine configured with a rule uses it."""
    from vllm.v1.sample import rejection_sampler as rs

    sampler_cls = rs.RejectionSampler
    if getattr(sampler_cls, "_stepspec_judged", False):
        return
    plain_init, plain_forward, plain_sample = sampler_cls.__init__, sampler_cls.forward, rs.rejection_sample
    state: dict[str, Any] = {}  # the rule of the sampler whose forward is running (one at a time per process)

    def __init__(self, sampler, spec_config=None, device=None):  # noqa: ANN001 (vLLM's signature)
        plain_init(self, sampler, spec_config, device)
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        extra = (config.additional_config or {}) if config is not None else {}
        self.stepspec_rule = self.stepspec_math = None
        if isinstance(extra, dict) and ADDITIONAL_KEY in extra:
            rule = self.stepspec_rule = AcceptRule.model_validate(extra[ADDITIONAL_KEY])
            if rule.math_max_rank is not None:
                mask = math_token_mask(config.model_config.tokenizer, config.model_config.get_vocab_size())
                self.stepspec_math = mask.to(device)
            logger.info("stepspec: judged token acceptance %s", rule.model_dump())

    def forward(self, metadata, draft_probs, logits, sampling_metadata):  # noqa: ANN001
        state["rule"], state["math"] = self.stepspec_rule, self.stepspec_math
        try:
            return plain_forward(self, metadata, draft_probs, logits, sampling_metadata)
        finally:
            state.clear()

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs):  # noqa: ANN001
        rule = state.get("rule")
        if rule is not None and not sampling_metadata.all_random and draft_token_ids.numel():
            greedy_rows = None
            if not sampling_metadata.all_greedy:
                import torch

                per_request = sampling_metadata.temperature == 0
                counts = torch.tensor(num_draft_tokens, device=per_request.device)
                greedy_rows = torch.repeat_interleave(per_request, counts, output_size=draft_token_ids.numel())
            judged_argmax_logits(target_logits, draft_token_ids, greedy_rows, rule, state.get("math"))
        return plain_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                            target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs)

    sampler_cls.__init__ = __init__
    sampler_cls.forward = forward
    sampler_cls._stepspec_judged = True
    rs.rejection_sample = rejection_sample
