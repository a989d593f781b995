"""The only code that talks to a model. Batches in, batches out.

Importing this package imports no model library: vLLM and torch load when an
engine starts.
"""

from stepspec.engine.protocol import Engine, EngineError
from stepspec.engine.stats import EngineStats, SpecDecodingStats
from stepspec.engine.types import (
    Completion,
    EngineInfo,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    NextTokenDistribution,
    Prompt,
    Sampling,
    Structured,
    TokenLogprob,
)

__all__ = [
    "Completion",
    "Engine",
    "EngineError",
    "EngineInfo",
    "EngineStats",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "NextTokenDistribution",
    "Prompt",
    "Sampling",
    "Structured",
    "SpecDecodingStats",
    "TokenLogprob",
]
