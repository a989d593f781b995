"""``embedding``: cosine similarity of sentence embeddings (bundled all-MiniLM-L6-v2).

Sentence embeddings do not read arithmetic: measured with MiniLM, "16 - 3 = 13
eggs remain" against "16 - 3 = 12 eggs remain" scores 0.986, while a faithful
paraphrase scores 0.77. So a step whose numbers differ from the target's is
never accepted here; it is rejected without confidence and a cascade escalates.

Similarity below ``reject_threshold`` rejects and, with equal numbers, at or
above ``accept_threshold`` accepts, both confidently; anything else is a
rejection without confidence (a cascade escalates it).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar, Sequence

from pydantic import Field, model_validator

from stepspec.common.options import Configured
from stepspec.judges.base import JudgeOptions, StepCandidate, Verdict, judge, require_target_steps
from stepspec.judges.exact import numbers_in


class EmbeddingOptions(JudgeOptions):
    owner: ClassVar[str] = "judge 'embedding'"

    model: str = Field("all-minilm-l6-v2", description="the sentence-embedding model: a preset, a path or a "
                       "Hugging Face id")
    accept_threshold: float = Field(0.85, ge=0, le=1, description="accept at or above this cosine similarity "
                                    "(when the steps state the same numbers)")
    reject_threshold: float = Field(0.5, ge=0, le=1, description="reject below this cosine similarity")
    device: str = Field("cpu", description="where the embedding model runs (cpu, cuda)")

    @model_validator(mode="after")
    def _ordered(self) -> EmbeddingOptions:
        if self.reject_threshold > self.accept_threshold:
            raise ValueError(f"need reject_threshold ({self.reject_threshold}) <= accept_threshold "
                             f"({self.accept_threshold})")
        return self


@judge("embedding", EmbeddingOptions, needs_engine=False,
       about="the cosine similarity of the drafted and the target's step (MiniLM); a step whose numbers "
             "differ is never accepted")
class EmbeddingJudge(Configured):
    name = "embedding"
    needs_target_step = True
    needs_draft_tokens = False  # verdicts need no drafted token ids and logprobs
    draft_top_k = 0

    def __init__(self, options: EmbeddingOptions | None = None, **overrides) -> None:
        """``options``, or keywords (``accept_threshold=0.9``) validated through :class:`EmbeddingOptions`."""
        self.options = EmbeddingOptions.build(options, **overrides)
        self._model = None

    def _encoder(self):
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            from stepspec.engine.models import resolve_model

            self._model = SentenceTransformer(resolve_model(self.options.model), device=self.options.device)
        return self._model

    def similarities(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        if not pairs:
            return []
        texts = [t for pair in pairs for t in pair]
        emb = self._encoder().encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        return [float(emb[2 * i] @ emb[2 * i + 1]) for i in range(len(pairs))]

    async def judge(self, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        require_target_steps(self.name, candidates)
        # in a thread: the event loop keeps serving the engines (lookahead's draft runs ahead meanwhile)
        sims = await asyncio.to_thread(self.similarities, [(c.draft_step, c.target_step) for c in candidates])
        return [Verdict(self.name, *self._decide(c, sim), score=sim) for c, sim in zip(candidates, sims)]

    def _decide(self, c: StepCandidate, sim: float) -> tuple[bool, bool]:
        """(accept, confident) for one candidate at similarity ``sim``."""
        if sim < self.options.reject_threshold:
            return False, True
        if numbers_in(c.draft_step) != numbers_in(c.target_step):
            return False, False
        if sim >= self.options.accept_threshold:
            return True, True
        return False, False
