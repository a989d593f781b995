"""What stepspec adds to each vLLM worker (vLLM's ``worker_extension_cls``).

vLLM mixes this class into its worker class in the worker process; the in-process
backend calls its methods by name through ``AsyncLLM.collective_rpc``.

Why: suffix decoding keeps every finished request's output in a global suffix tree
(up to ``suffix_decoding_max_cached_requests``) and proposes from it for later
requests. That is what makes it fast on repeated text, and what makes a benchmark
unfair: an arm that solves problems another arm solved before replays that arm's
text at a higher acceptance. :meth:`StepspecWorker.stepspec_reset_token_speculation`
forgets those outputs, as ``reset_prefix_cache`` forgets cached KV blocks.
"""

from __future__ import annotations


class StepspecWorker:
    """Methods vLLM adds to its worker (``self`` is the worker)."""

    def stepspec_reset_token_speculation(self) -> int:
        """Forget the outputs a token-level proposer kept from finished requests (suffix
        decoding's global tree); returns how many were forgotten. Only between requests:
        one still running is an error (its tree is in use)."""
        cache = getattr(getattr(self.model_runner, "drafter", None), "suffix_cache", None)
        if cache is None:  # no speculation, or a proposer with no cross-request state (ngram, a draft model)
            return 0
        # The proposer stops a finished request's tree at its next call; after the last request
        # there was none. A request still in the batch is running: its tree is in use.
        running = set(self.model_runner.input_batch.req_id_to_index)
        if cache.active_requests & running:
            raise RuntimeError(f"{len(cache.active_requests & running)} requests are running; reset token "
                               "speculation between requests")
        for req_id in list(cache.active_requests):
            cache.stop_request(req_id)
        cached = list(cache.cached_requests)
        for req_id in cached:
            cache.evict_cached_response(req_id)
        return len(cached)
