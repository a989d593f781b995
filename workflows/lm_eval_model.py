"""Moved to :mod:`workflows.eval.lm_eval_model`; importing this name still registers the
``stepspec`` model with lm-evaluation-harness."""

from workflows.eval.lm_eval_model import StepspecLM, main  # noqa: F401
