"""stepspec as a model of lm-evaluation-harness: score a speculative reasoner with the
harness you already trust.

    stepspec lm-eval --model stepspec --model_args strategy=specreason,spec=draft \\
        --tasks gsm8k_stepspec --include_path workflows/lm_eval_tasks --limit 3

``stepspec lm-eval`` is the harness's own command line with this model
registered (lm-eval 0.4 has no plugin hook for models outside its tree, so the
bare ``lm_eval`` command cannot see it). From Python, importing this module
registers it: ``lm_eval.simple_evaluate(model="stepspec", model_args=...)``.

Each request's context is a question; the reasoner solves the batch
concurrently (the engines batch the steps) and returns the trace's text, cut at
the first of the request's ``until`` strings. ``model_args``: ``strategy``,
``target``, ``draft``, ``spec``/``draft_spec`` (token-level speculation),
``judge``, ``threshold`` (score judge), ``max_tokens``, ``max_step_tokens``,
``max_steps``, ``delimiter``, ``kv_cache_gib``, ``max_model_len``, and any
option of the strategy (``gamma``, ``first_target_steps``, ...). The harness's
``--batch_size`` bounds the problems in flight. Only generation tasks apply:
a reasoner has no log-likelihoods to give.
"""

from __future__ import annotations

import logging
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from engine.models import BUNDLED_DRAFT, BUNDLED_TARGET
from orchestrator.run import Budget
from orchestrator.steps import StepRules

logger = logging.getLogger(__name__)


def cut_at(text: str, until: list[str] | tuple[str, ...]) -> str:
    """``text`` up to the first of the ``until`` strings (the harness's stop sequences)."""
    cuts = [text.index(s) for s in until if s and s in text]
    return text[: min(cuts)] if cuts else text


@register_model("stepspec")
class StepspecLM(LM):
    def __init__(self, strategy: str = "specreason", target: str = BUNDLED_TARGET, draft: str = BUNDLED_DRAFT,
                 spec: str = "none", draft_spec: str = "none", judge: str | None = None,
                 threshold: float | None = None, max_tokens: int = 1024, max_step_tokens: int = 256,
                 max_steps: int = 64, delimiter: str = "\n\n", kv_cache_gib: float = 1.0, max_model_len: int = 4096,
                 batch_size: int | str | None = None, max_batch_size: int | None = None, device: str | None = None,
                 reasoner: Any = None, **strategy_options: Any) -> None:
        """``reasoner``: a :class:`orchestrator.reasoner.Reasoner` you built (e.g. over
        OpenAI-compatible servers) instead of one from these arguments."""
        super().__init__()
        from orchestrator.reasoner import Reasoner

        if reasoner is not None:
            self.reasoner, self.strategy = reasoner, reasoner.strategy.name
            return
        if device not in (None, "cpu", "cuda") and not str(device).startswith("cuda"):
            raise ValueError(f"stepspec: device {device!r}: vLLM places the models itself; leave --device unset")
        concurrency = 8 if batch_size in (None, "auto") or str(batch_size).startswith("auto") else int(batch_size)
        judge_options = {} if threshold is None else {"threshold": float(threshold)}
        self.reasoner = Reasoner.from_models(
            target, draft, target_spec=spec, draft_spec=draft_spec, kv_cache_gib=float(kv_cache_gib),
            max_model_len=int(max_model_len), strategy=strategy, judge=judge, judge_options=judge_options,
            rules=StepRules(delimiter=delimiter.encode().decode("unicode_escape")),
            budget=Budget(max_tokens=int(max_tokens), max_step_tokens=int(max_step_tokens), max_steps=int(max_steps)),
            max_concurrency=concurrency, **strategy_options)
        self.strategy = strategy

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        questions = [req.args[0] for req in requests]
        solutions = self.reasoner.solve_many(questions)
        out = []
        for req, solution in zip(requests, solutions):
            if solution.error:
                logger.error("stepspec: a problem failed (%s); its partial trace is scored", solution.error)
            gen_kwargs = req.args[1] if len(req.args) > 1 else {}
            until = gen_kwargs.get("until") or []
            text = cut_at(solution.trace.text, [until] if isinstance(until, str) else until)
            self.cache_hook.add_partial("generate_until", req.args, text)
            out.append(text)
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("stepspec writes reasoning traces and gives no log-likelihoods; "
                                  "use generation tasks (output_type: generate_until), e.g. gsm8k_stepspec")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("stepspec writes reasoning traces and gives no log-likelihoods; "
                                  "use generation tasks (output_type: generate_until)")

    def close(self) -> None:
        """Stop the engines (the harness never asks; its process ends instead)."""
        self.reasoner.close()


def main(argv: list[str] | None = None) -> None:
    """``stepspec lm-eval ...``: the harness's command line, with the stepspec model registered."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()
