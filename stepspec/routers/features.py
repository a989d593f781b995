"""Router features: what a router reads about a drafted step, at almost no cost.

Everything here comes from what the draft has already produced (its text and
token logprobs) and from the trace so far: no extra model call, except the
optional sentence embedding of the step (bundled all-MiniLM-L6-v2, a few
milliseconds on a CPU).

Feature set version 2 (``FEATURE_VERSION``), in this order (version 2 added the
three ``head_`` features: the literature on step routing finds the draft's
uncertainty at the start of a step predictive of a step that goes wrong):

==================== ==================================================================
name                 meaning
==================== ==================================================================
mean_logprob         mean over the step's tokens of the draft's logprob of the token it wrote
min_logprob          the lowest of those logprobs (the step's least sure token)
low_conf_share       share of the step's tokens written with probability below 0.5
mean_entropy         mean top-k entropy (nats) of the draft's next-token distribution
max_entropy          the highest of those entropies
head_mean_entropy    mean entropy over the step's first ``HEAD_TOKENS`` (8) tokens
head_max_entropy     the highest entropy among those first tokens
head_mean_logprob    mean logprob of the draft's own tokens among those first tokens
log_num_tokens       log(1 + tokens in the step)
log_position         log(1 + the step's index in the trace)
cut                  1 if the step was cut by the per-step token cap
opens_with_cue       1 if the step opens with a reflection cue word (``CUE_WORDS``)
num_cue_words        how many cue words the step holds anywhere
has_answer           1 if the step holds a ``\\boxed{}`` answer
log_num_numbers      log(1 + numbers in the step): how much arithmetic it does
has_code             1 if the step holds a ``` fence (the pair sometimes switches to code)
history_target_share share of the previous steps the target wrote (0 at the first step)
last_step_target     1 if the target wrote the previous step
emb_0 .. emb_383     the step's MiniLM sentence embedding, unit length (with ``embedding``)
==================== ==================================================================

The version changes whenever any of these changes meaning; a router file
records the version and names it was trained on, and loading it under a
different version is an error (:mod:`stepspec.routers.learned`). Collected examples keep
the raw inputs (texts, logprobs, entropies), so a new version can be computed
from old collections.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from stepspec.common.states import Author
from stepspec.routers.base import RoutingState

if TYPE_CHECKING:
    import numpy as np

FEATURE_VERSION = 2
HEAD_TOKENS = 8  # a step's first tokens: where the draft picks its way
EMBEDDING_MODEL = "all-minilm-l6-v2"
EMBEDDING_DIM = 384
CUE_WORDS = ("wait", "but", "however", "actually", "alternatively", "hmm", "check", "verify", "recheck",
             "mistake", "instead", "oops", "let me")
SCALAR_FEATURES = ("mean_logprob", "min_logprob", "low_conf_share", "mean_entropy", "max_entropy",
                   "head_mean_entropy", "head_max_entropy", "head_mean_logprob", "log_num_tokens", "log_position",
                   "cut", "opens_with_cue", "num_cue_words", "has_answer", "log_num_numbers", "has_code",
                   "history_target_share", "last_step_target")

_CUE = re.compile(r"\b(" + "|".join(re.escape(c) for c in CUE_WORDS) + r")\b", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_LEAD = re.compile(r"^[\s*#>\-_`]*(?:\d+[.)]\s*)?[\s*#>\-_`]*")


@dataclass(frozen=True)
class FeatureSet:
    """Which features a router uses: the version and whether the embedding is in."""

    version: int = FEATURE_VERSION
    embedding: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        emb = tuple(f"emb_{i}" for i in range(EMBEDDING_DIM)) if self.embedding else ()
        return SCALAR_FEATURES + emb


def scalar_features(s: RoutingState) -> list[float]:
    lps, ents = s.token_logprobs, s.token_entropies
    n = len(lps)
    text = s.draft_step
    head = _LEAD.sub("", text, count=1)
    authors = s.previous_authors
    head_lps, head_ents = lps[:HEAD_TOKENS], ents[:HEAD_TOKENS]
    return [
        sum(lps) / n if n else 0.0,
        min(lps) if n else 0.0,
        sum(1 for lp in lps if lp < math.log(0.5)) / n if n else 0.0,
        sum(ents) / len(ents) if ents else 0.0,
        max(ents) if ents else 0.0,
        sum(head_ents) / len(head_ents) if head_ents else 0.0,
        max(head_ents) if head_ents else 0.0,
        sum(head_lps) / len(head_lps) if head_lps else 0.0,
        math.log1p(n),
        math.log1p(s.position),
        0.0 if s.complete else 1.0,
        1.0 if (m := _CUE.match(head)) is not None and m.start() == 0 else 0.0,
        float(len(_CUE.findall(text))),
        1.0 if "\\boxed{" in text else 0.0,
        math.log1p(len(_NUMBER.findall(text))),
        1.0 if "```" in text else 0.0,
        sum(a == Author.TARGET for a in authors) / len(authors) if authors else 0.0,
        1.0 if authors and authors[-1] == Author.TARGET else 0.0,
    ]


@functools.lru_cache(maxsize=2)
def _embedder(model: str):
    from sentence_transformers import SentenceTransformer

    from stepspec.engine.models import resolve_model

    return SentenceTransformer(resolve_model(model), device="cpu")


def featurize(states: Sequence[RoutingState], feature_set: FeatureSet = FeatureSet()) -> "np.ndarray":
    """The feature matrix (float32, one row per state, columns ``feature_set.names``)."""
    import numpy as np

    if feature_set.version != FEATURE_VERSION:
        raise ValueError(f"this stepspec computes router feature set version {FEATURE_VERSION}, "
                         f"not {feature_set.version}")
    scalars = np.array([scalar_features(s) for s in states], dtype=np.float32).reshape(len(states),
                                                                                       len(SCALAR_FEATURES))
    if not feature_set.embedding:
        return scalars
    if not states:
        return np.zeros((0, len(feature_set.names)), dtype=np.float32)
    emb = _embedder(EMBEDDING_MODEL).encode([s.draft_step for s in states], normalize_embeddings=True,
                                            convert_to_numpy=True, batch_size=64)
    return np.concatenate([scalars, emb.astype(np.float32)], axis=1)
