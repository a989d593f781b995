"""Training problems that cannot leak into a benchmark: generated, with gold answers.

Whatever stepspec trains (a learned router, an aligned draft) learns from these, never from
an evaluation set. They come from reasoning-gym's procedural generators, offline and seeded,
chosen for a number as the answer and a few steps of reasoning: counting legs, siblings,
simple equations, chains of sums, decimals, products, GCD/LCM, polygon angles, number
sequences. Not ``gsm_symbolic``: its templates are GSM8K test problems with new names and
numbers (99 of its 100 generators match a GSM8K test question).

The instruction tails some generators add ("Give only the result as your final answer.")
are dropped: the problems are solved step by step, in the prompt every strategy uses.

:func:`near_duplicates` is the contamination check: every training question against every
question of the evaluation files in the data folder, digits masked (a template with new
numbers is the same question), by edit distance over words. A worked example: "Tom has 3
apples and buys 5 more." against "Ann has 12 pears and buys 7 more." mask to "tom has #
apples and buys # more." and "ann has # pears and buys # more.": 2 words of 7 differ,
distance 0.29, a near duplicate (within 0.5).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from stepspec.workflows.eval.datasets import DATASETS, DatasetError, Problem, find_data_dir, load_dataset

# stepspec name -> reasoning-gym generator. Each gives a number as its answer.
GENERATORS = {
    "leg-counting": "leg_counting",
    "siblings": "aiw",
    "simple-equations": "simple_equations",
    "basic-arithmetic": "basic_arithmetic",
    "chain-sum": "chain_sum",
    "decimal-chain-sum": "decimal_chain_sum",
    "products": "products",
    "gcd": "gcd",
    "lcm": "lcm",
    "polygon-angles": "simple_geometry",
    "number-sequence": "number_sequence",
}
DEFAULT_GENERATORS = tuple(GENERATORS)
# A training question this close to an evaluation question (word edit distance over the
# longer question's words, digits masked) is a near duplicate. gsm_symbolic's questions lie
# 0.24-0.56 from their GSM8K originals (28 of 30 within 0.5); GSM8K's own questions 0.43-0.9
# from each other (one of 30 within 0.5); the default generators' 0.65 or more.
NEAR_DUPLICATE = 0.5

_ANSWER_ONLY = re.compile(
    r"[^.?!]*\b(?:give only|return only|only reply|reply only|reply with just|do not give the units|"
    r"your output should be a single number)[^.?!]*[.?!]?", re.IGNORECASE)


class TrainingProblemsError(ValueError):
    """Training problems cannot be made; the message names the problem and the fix."""


def _clean(question: str) -> str:
    return " ".join(_ANSWER_ONLY.sub(" ", question).split())


def generated_problems(num: int, seed: int, generators: Sequence[str] = DEFAULT_GENERATORS) -> list[Problem]:
    """``num`` problems, drawn in turn from ``generators`` (seeded: the same call, the same
    problems), each a :class:`Problem` whose source is ``generated:<generator>``."""
    unknown = [g for g in generators if g not in GENERATORS]
    if unknown or not generators:
        raise TrainingProblemsError(f"unknown generator(s) {unknown}; choose from {', '.join(GENERATORS)}")
    try:
        import reasoning_gym
    except ImportError as e:
        raise TrainingProblemsError("generated problems need the reasoning-gym package: pip install "
                                    "'reasoning-gym==0.1.25' (stepspec's bootstrap installs it)") from e
    per = -(-num // len(generators))
    pools = {g: reasoning_gym.create_dataset(GENERATORS[g], size=per, seed=seed + k)
             for k, g in enumerate(generators)}
    order = [(g, i) for i in range(per) for g in generators][:num]
    random.Random(seed).shuffle(order)
    return [Problem(f"generated:{g}", n, _clean(pools[g][i]["question"]), str(pools[g][i]["answer"]))
            for n, (g, i) in enumerate(order)]


def mask(question: str) -> str:
    """What the contamination check compares: lower case, digits as ``#``, spaces collapsed."""
    return " ".join(re.sub(r"\d+(?:[.,]\d+)*", "#", question.lower()).split())


def edit_distance(a: Sequence[str], b: Sequence[str], limit: int) -> int:
    """Levenshtein distance of two sequences (words, or a string's characters), or
    ``limit + 1`` once it must exceed ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
        if min(current) > limit:
            return limit + 1
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class NearDuplicate:
    training: int  # index in the training questions
    dataset: str
    index: int  # the evaluation question's index in its dataset
    distance: float  # word edit distance over the longer question's words


def near_duplicates(questions: Sequence[str], data_dir: str | Path | None = None,
                    threshold: float = NEAR_DUPLICATE, candidates: int = 5) -> list[NearDuplicate]:
    """Every training question within ``threshold`` (word edit distance over the longer
    masked question's words) of a question in the evaluation files of the data folder. Each
    is measured against the ``candidates`` evaluation questions sharing the most words with
    it (a near duplicate shares most of its words)."""
    try:
        folder = find_data_dir(None if data_dir is None else str(data_dir))
    except DatasetError:
        return []  # no evaluation files on this machine: nothing to leak into
    evaluation = [(name, p.index, mask(p.question).split()) for name, ds in DATASETS.items()
                  if (folder / ds.file).is_file() for p in load_dataset(name, folder).problems]
    vocab = [set(words) for _, _, words in evaluation]
    found = []
    for i, question in enumerate(questions):
        mine = mask(question).split()
        own = set(mine)
        nearest = sorted(range(len(evaluation)), key=lambda k: -len(own & vocab[k]) / len(own | vocab[k]))
        for k in nearest[:candidates]:
            name, j, theirs = evaluation[k]
            longer = max(len(mine), len(theirs))
            d = edit_distance(mine, theirs, int(threshold * longer))
            if d <= threshold * longer:
                found.append(NearDuplicate(i, name, j, round(d / longer, 3)))
    return found


@dataclass(frozen=True)
class Drawn:
    problems: list[Problem]  # the first ``num`` not near any evaluation question
    num_drawn: int
    num_dropped: int  # near duplicates among the drawn


def uncontaminated_problems(num: int, seed: int, generators: Sequence[str] = DEFAULT_GENERATORS,
                            data_dir: str | Path | None = None) -> Drawn:
    """``num`` generated problems, none a near duplicate of an evaluation question: a quarter
    more are drawn, the near duplicates dropped, the first ``num`` of the rest kept (fewer
    if too many were dropped)."""
    drawn = generated_problems(num + num // 4 + 8, seed, generators)
    dropped = {hit.training for hit in near_duplicates([p.question for p in drawn], data_dir)}
    kept = [p for p in drawn if p.index not in dropped][:num]
    return Drawn(kept, len(drawn), len(dropped))


def check_uncontaminated(problems: Sequence[Problem], data_dir: str | Path | None = None) -> None:
    """Raise if any training problem is a near duplicate of an evaluation question."""
    if hits := near_duplicates([p.question for p in problems], data_dir):
        shown = "; ".join(f"training #{h.training} ~ {h.dataset} #{h.index} (distance {h.distance})"
                          for h in hits[:5])
        raise TrainingProblemsError(
            f"{len(hits)} training question(s) are near duplicates of evaluation questions: {shown}"
            f"{'; ...' if len(hits) > 5 else ''}. Remove them or choose other generators: a model trained "
            "on them would be scored on what it saw")
