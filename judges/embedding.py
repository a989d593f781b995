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
from typing import Sequence

from judges.base import JudgeError, StepCandidate, Verdict, require_target_steps
from judges.exact import numbers_in


class EmbeddingJudge:
    name = "embedding"
    needs_target_step = True

    def __init__(self, model: str = "all-minilm-l6-v2", accept_threshold: float = 0.85,
                 reject_threshold: float = 0.5, device: str = "cpu") -> None:
        if not 0 <= reject_threshold <= accept_threshold <= 1:
            raise JudgeError(
                f"embedding judge: need 0 <= reject_threshold ({reject_threshold}) <= "
                f"accept_threshold ({accept_threshold}) <= 1"
            )
        self.model_name = model
        self.accept_threshold = accept_threshold
        self.reject_threshold = reject_threshold
        self.device = device
        self._model = None

    def _encoder(self):
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            from engine.models import resolve_model

            self._model = SentenceTransformer(resolve_model(self.model_name), device=self.device)
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
        if sim < self.reject_threshold:
            return False, True
        if numbers_in(c.draft_step) != numbers_in(c.target_step):
            return False, False
        if sim >= self.accept_threshold:
            return True, True
        return False, False
