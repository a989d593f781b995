"""stepspec as a model of lm-evaluation-harness: score a speculative reasoner with the
harness you already trust.

    stepspec lm-eval --model stepspec --model_args strategy=specreason,spec=draft \\
        --tasks gsm8k_stepspec --include_path stepspec/workflows/lm_eval_tasks --limit 3

``stepspec lm-eval`` is the harness's own command line with this model
registered (lm-eval 0.4 has no plugin hook for models outside its tree, so the
bare ``lm_eval`` command cannot see it). From Python, importing this module
registers it: ``lm_eval.simple_evaluate(model="stepspec", model_args=...)``.

Each request's context is a question; the reasoner solves the batch
concurrently (the engines batch the steps) and returns the trace's text, cut at
the first of the request's ``until`` strings. ``model_args`` are the command line's
settings, with the same defaults (:class:`stepspec.orchestrator.config.RunSettings`): ``strategy``,
``target``, ``draft``, ``spec`` (or ``target_spec``; default ``auto``, as on the command
line: the strategy's own token-level method inside the target) and ``draft_spec``, ``target_dtype``/``draft_dtype``
(``auto``: the fastest on this machine, measured), ``num_speculative_tokens``,
``target_url``/``draft_url`` (OpenAI-compatible servers; the model is then the name they
serve) and ``api_key_env``, ``judge``, ``threshold`` (score judge), ``max_tokens``,
``max_step_tokens``, ``max_steps``, ``timeout``, ``delimiter``, ``kv_cache_gib``,
``max_model_len``, and any option of the strategy (``gamma``, ``first_target_steps``, ...).
A setting that is a mapping takes its keys dotted, one argument each (the harness splits
``model_args`` at commas): ``judge_options.floor=-3,judge_options.math_max_rank=1``,
``target_accept.max_rank=2,target_accept.floor=-2``.
The harness's ``--batch_size`` bounds the problems in flight. Only generation tasks apply:
a reasoner has no log-likelihoods to give.
"""

from __future__ import annotations

import logging
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval fills its registry lazily, only while it is empty:
from lm_eval.api.model import LM  # registering ours first would hide its own models)
from lm_eval.api.registry import register_model

from stepspec.orchestrator.config import ReasonerConfig, RunSettings

logger = logging.getLogger(__name__)


def cut_at(text: str, until: list[str] | tuple[str, ...]) -> str:
    """``text`` up to the first of the ``until`` strings (the harness's stop sequences)."""
    cuts = [text.index(s) for s in until if s and s in text]
    return text[: min(cuts)] if cuts else text


def undotted(model_args: dict[str, Any]) -> dict[str, Any]:
    """``model_args`` with dotted keys folded into mappings: ``{"target_accept.max_rank": 2}`` is
    ``{"target_accept": {"max_rank": 2}}``."""
    args: dict[str, Any] = {}
    for key, value in model_args.items():
        *outer, last = key.split(".")
        into = args
        for part in outer:
            into = into.setdefault(part, {})
            if not isinstance(into, dict):
                raise ValueError(f"model_args: '{key}' sets a key inside '{part}', which is also given a value of its "
                                 "own; give one or the other")
        if isinstance(into.get(last), dict):
            raise ValueError(f"model_args: '{key}' gives a value to a setting that dotted keys also set inside; give "
                             "one or the other")
        into[last] = value
    return args


def reasoner_config(model_args: dict[str, Any], max_concurrency: int | None = None) -> ReasonerConfig:
    """The reasoner's config for lm-eval's ``model_args`` (see the module's docstring)."""
    args = undotted(model_args)
    if "spec" in args:
        args["target_spec"] = args.pop("spec")
    if isinstance(args.get("delimiter"), str):
        args["delimiter"] = args["delimiter"].encode().decode("unicode_escape")
    threshold = args.pop("threshold", None)
    settings, rest = RunSettings.split(args)
    judge_options = rest.pop("judge_options", {})
    if not isinstance(judge_options, dict):
        raise ValueError(f"model_args: judge_options={judge_options!r} is not a mapping; give each option as a "
                         "dotted key, e.g. judge_options.floor=-3")
    judge_options = {**judge_options, **({} if threshold is None else {"threshold": float(threshold)})}
    return settings.reasoner_config(judge_options=judge_options, **rest,
                                    **({} if max_concurrency is None else {"max_concurrency": max_concurrency}))


@register_model("stepspec")
class StepspecLM(LM):
    def __init__(self, batch_size: int | str | None = None, max_batch_size: int | None = None,
                 device: str | None = None, reasoner: Any = None, **model_args: Any) -> None:
        """``model_args``: see the module's docstring. ``reasoner``: a
        :class:`stepspec.orchestrator.reasoner.Reasoner` you built instead of one from them."""
        super().__init__()
        from stepspec.orchestrator.reasoner import Reasoner

        if reasoner is not None:
            self.reasoner, self.strategy = reasoner, reasoner.strategy.name
            return
        if device not in (None, "cpu", "cuda") and not str(device).startswith("cuda"):
            raise ValueError(f"stepspec: device {device!r}: vLLM places the models itself; leave --device unset")
        auto = batch_size in (None, "auto") or str(batch_size).startswith("auto")
        config = reasoner_config(model_args, None if auto else int(batch_size))
        self.reasoner, self.strategy = Reasoner.from_config(config), config.strategy

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
