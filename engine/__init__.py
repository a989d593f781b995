"""The only code that talks to a model. Batches in, batches out.

Importing this package imports no model library: vLLM and torch load when an
engine starts.
"""

from engine.protocol import Engine, EngineError
from engine.stats import EngineStats, SpecDecodingStats
from engine.types import (
    Completion,
    EngineInfo,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    NextTokenDistribution,
    Prompt,
    SamplingSpec,
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
    "SamplingSpec",
    "SpecDecodingStats",
    "TokenLogprob",
]
