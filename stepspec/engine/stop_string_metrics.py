"""A vLLM plugin that keeps the token-level speculation counters of a request a stop string ends.

The bug (vLLM 0.32.0, every platform). A request's speculation counters
(``CompletionOutput.spec_decode_metrics``: how many drafts, drafted tokens, accepted
tokens) are kept by the engine core's scheduler and sent with the request's last
output only when the core itself finishes the request (``max_tokens``, EOS, a stop
token id). Stop *strings* are found later, by the front end's detokenizer, which then
aborts the request in the core: its counters never leave the core and the completion
reports none. A step-by-step trace ends nearly every generation at a stop string (the
step delimiter, ``"\\n\\n"``), so its counters read zero. For example a specreason
trace whose target wrote 115 tokens in 13 calls with the 0.5B drafting inside it read
``num_drafts=0``, while the engine's own counters showed ~3 drafted tokens a pass.

The fix. In the engine core process (``vllm.general_plugins`` entry point),
``Scheduler.update_from_output`` is wrapped: each output of a request the core has not
finished and that a stop string may end carries a copy of the request's counters so far
(a request without stop strings is always finished by the core). The front end already keeps
the latest counters it was sent and reports them with the completion, so a request a
stop string ends reports its counters up to that output (the tokens past the stop string
in the same pass included). A request the core finishes carries its final counters, as
before. Idempotent; does nothing for requests without counters (no speculation, or
``per_request_spec_decode_metrics="none"``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

logger = logging.getLogger(__name__)


def counters_so_far(metrics: Any) -> Any:
    """A copy of a request's counters: the core goes on adding to the original while the
    output that carries the copy is serialized in another thread."""
    return dataclasses.replace(metrics, histogram=list(metrics.histogram),
                               per_step_accepted=list(metrics.per_step_accepted),
                               per_step_drafted=list(metrics.per_step_drafted))


def with_running_counters(update_from_output):
    """``Scheduler.update_from_output``, with the counters of each running request that has
    stop strings on its output."""

    @functools.wraps(update_from_output)
    def wrapped(self, scheduler_output, model_runner_output):
        outputs = update_from_output(self, scheduler_output, model_runner_output)
        for engine_outputs in outputs.values():
            for out in engine_outputs.outputs:
                if out.spec_decode_metrics is not None:  # finished by the core: its final counters
                    continue
                request = self.requests.get(out.request_id)
                if (request is not None and request.spec_decode_metrics is not None
                        and request.sampling_params is not None and request.sampling_params.stop):
                    out.spec_decode_metrics = counters_so_far(request.spec_decode_metrics)
        return outputs

    wrapped.stepspec_running_counters = True
    return wrapped


def register() -> None:
    """vLLM general-plugin hook: wrap the scheduler's output step (once per process)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler.update_from_output, "stepspec_running_counters", False):
        return
    Scheduler.update_from_output = with_running_counters(Scheduler.update_from_output)
    logger.info("stepspec: vLLM's scheduler sends running requests' speculation counters (stop-string fix)")
