"""Train a learned router from collected steps, measure it, and choose its tau.

Data: :class:`stepspec.routers.base.RoutingExample` records (``stepspec router collect``,
then ``stepspec router verify`` for the verifier's verdicts).
Label (``Label``):

* ``verifier`` (default): 1 when the target's likelihood verifier cut the drafted
  step (a token the target finds implausible): the steps ``specreason`` with the
  likelihood judge sends to the target. It follows correctness: where the 0.5B
  goes wrong, the 1.5B gives the wrong token a logprob below -5;
* ``advantage``: 1 when the target's step is rated better by more than ``margin``
  (the 0-9 self-score by default, which rates almost every step alike).

Examples without the label's data (not verified, not rated) are left out and counted.

The split is by problem (all steps of a problem on one side), seeded, so the
held-out numbers are about unseen problems. On the held-out side:

* ROC-AUC of p_target against the label;
* the routing curve: for each tau, the share of steps routed to the target
  (target calls), the share of the candidates' tokens the target wrote, the
  share of the verifier-cut steps left with the draft (missed cuts), and the
  mean step rating of the trace it would build, beside the same numbers for
  ``specreason-likelihood`` (exactly the cut steps to the target), ``specreason``
  (target where the draft's rating is below its threshold) and the oracle (the
  better-rated candidate every time).

Tau is chosen on the held-out side for the user's goal:

* ``target_budget=r``: the lowest tau whose share of target calls is at most r
  (most of the target's help within the budget); with the ``verifier`` label and
  no goal given, r is the training steps' cut share (as many target calls as
  specreason-likelihood makes);
* ``match_specreason=True`` (``advantage`` label): among taus whose mean rating
  reaches specreason's, the one with the fewest target tokens. If none reaches it,
  the best-rated tau is taken and ``goal_met`` is False (said, not hidden).

Worked example, verifier label: 1000 held-out steps, 300 cut by the verifier. At
tau 0.4 the router sends 320 steps to the target, 240 of them cut ones: target
calls 32%, missed cuts 60 / 300 = 20%; specreason-likelihood: 30% and 0%.
"""

from __future__ import annotations

import enum
import math
import os
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field

from stepspec.common.files import JsonlError, read_jsonl
from stepspec.routers.base import RouterError, RoutingExample, VerifiedStep
from stepspec.routers.features import FeatureSet, featurize
from stepspec.routers.learned import LearnedRouter, build_net


EXAMPLES_FILE, VERDICTS_FILE = "examples.jsonl", "verdicts.jsonl"


def read_collection(directory: str | os.PathLike) -> tuple[list[RoutingExample], int]:
    """A collection's examples with the verifier's verdicts (``verdicts.jsonl``, when
    ``stepspec router verify`` has run) filled in; see :func:`read_examples`."""
    directory = Path(directory)
    examples, dropped = read_examples(directory / EXAMPLES_FILE)
    verdicts = read_verdicts(directory / VERDICTS_FILE)
    return [replace(ex, verifier_cut=v.cut, verifier_plausible=v.plausible)
            if (v := verdicts.get((ex.problem_id, ex.state.position))) is not None else ex
            for ex in examples], dropped


def read_verdicts(path: str | os.PathLike) -> dict[tuple[str, int], VerifiedStep]:
    """The verdicts by (problem, position); none when the file is not there."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        read = read_jsonl(path, VerifiedStep.from_dict)
    except JsonlError as e:
        raise RouterError(f"{e.path}:{e.lineno}: malformed verdict ({e.cause}); remove the line and verify "
                          "again (it goes on where it stopped)") from e
    return {(v.problem_id, v.position): v for v in read.records}


def read_examples(path: str | os.PathLike) -> tuple[list[RoutingExample], int]:
    """Examples of a collection file; a later record of the same (problem, position)
    replaces an earlier one (a problem collected again after an interruption).
    Returns (examples, number of malformed lines skipped: only a cut-off last line)."""
    path = Path(path)
    if not path.is_file():
        raise RouterError(f"{path} does not exist; collect steps first with `stepspec router collect`")
    try:
        read = read_jsonl(path, RoutingExample.from_dict)  # a last line cut off when a collection was killed
    except JsonlError as e:
        raise RouterError(f"{e.path}:{e.lineno}: malformed example ({e.cause}); remove the line or collect again") from e
    by_key = {(ex.problem_id, ex.state.position): ex for ex in read.records}
    return list(by_key.values()), int(read.torn_line is not None)


class Label(str, enum.Enum):
    """What a router learns to predict (see the module docstring)."""

    VERIFIER = "verifier"
    ADVANTAGE = "advantage"

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value


def labelled(examples: Sequence[RoutingExample], label: Label) -> list[RoutingExample]:
    """The examples that carry ``label``'s data (verified, or rated)."""
    if label is Label.VERIFIER:
        return [ex for ex in examples if ex.verifier_cut is not None]
    return [ex for ex in examples if ex.advantage is not None]


def labels(examples: Sequence[RoutingExample], label: Label, margin: float) -> list[int]:
    if label is Label.VERIFIER:
        return [int(bool(ex.verifier_cut)) for ex in examples]
    return [int(ex.advantage > margin) for ex in examples]  # type: ignore[operator]


def split_by_problem(examples: Sequence[RoutingExample], held_out: float, seed: int
                     ) -> tuple[list[RoutingExample], list[RoutingExample]]:
    if not 0 < held_out < 1:
        raise RouterError(f"held_out must be within (0, 1), got {held_out}")
    problems = sorted({ex.problem_id for ex in examples})
    if len(problems) < 2:
        raise RouterError(f"need steps of at least 2 problems to hold some out, got {len(problems)}")
    random.Random(seed).shuffle(problems)
    n_out = min(len(problems) - 1, max(1, round(held_out * len(problems))))
    out = set(problems[:n_out])
    return [ex for ex in examples if ex.problem_id not in out], [ex for ex in examples if ex.problem_id in out]


def roc_auc(y: Sequence[int], p: Sequence[float]) -> float | None:
    """Probability that a random positive scores above a random negative (ties: half).
    None when one class is missing."""
    pos = [s for s, t in zip(p, y) if t]
    neg = [s for s, t in zip(p, y) if not t]
    if not pos or not neg:
        return None
    order = sorted(range(len(p)), key=lambda i: p[i])
    ranks = [0.0] * len(p)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and p[order[j + 1]] == p[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    rank_pos = sum(r for r, t in zip(ranks, y) if t)
    return (rank_pos - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


@dataclass(frozen=True)
class CurvePoint:
    tau: float
    target_call_share: float  # steps routed to the target
    target_token_share: float  # the target's share of the kept steps' tokens
    mean_quality: float | None  # rating of the kept steps (the target's where routed); None: none rated
    missed_cut_share: float | None = None  # verifier-cut steps left with the draft; None: none cut or verified


def routing_point(routed: Sequence[bool], examples: Sequence[RoutingExample], tau: float = math.nan) -> CurvePoint:
    n = len(examples)
    tokens = [ex.num_target_tokens if r else ex.num_draft_tokens for r, ex in zip(routed, examples)]
    target_tokens = sum(t for t, r in zip(tokens, routed) if r)
    quality = [q for r, ex in zip(routed, examples)
               if (q := ex.target_quality if r else ex.draft_quality) is not None]
    cut = [r for r, ex in zip(routed, examples) if ex.verifier_cut]
    return CurvePoint(tau, sum(routed) / n, target_tokens / max(1, sum(tokens)),
                      sum(quality) / len(quality) if quality else None,
                      (len(cut) - sum(cut)) / len(cut) if cut else None)


def routing_curve(p: Sequence[float], examples: Sequence[RoutingExample]) -> list[CurvePoint]:
    """One point per distinct tau worth trying: every predicted probability, plus 1.01 (never route)."""
    taus = sorted({float(x) for x in p}) + [1.01]
    return [routing_point([x >= tau for x in p], examples, tau) for tau in taus]


def reference_points(examples: Sequence[RoutingExample], specreason_threshold: float) -> dict[str, CurvePoint]:
    """What the fixed policies do on the same steps (those that need ratings or verdicts
    only where every step has them)."""
    refs = {
        "draft-only": routing_point([False] * len(examples), examples),
        "target-only": routing_point([True] * len(examples), examples),
    }
    if all(ex.verifier_cut is not None for ex in examples):
        refs["specreason-likelihood"] = routing_point([bool(ex.verifier_cut) for ex in examples], examples)
    if all(ex.advantage is not None for ex in examples):
        refs["specreason"] = routing_point([ex.draft_quality < specreason_threshold  # type: ignore[operator]
                                            for ex in examples], examples)
        refs["oracle"] = routing_point([ex.target_quality > ex.draft_quality  # type: ignore[operator]
                                        for ex in examples], examples)
    return refs


def choose_tau(curve: Sequence[CurvePoint], *, target_budget: float | None = None,
               min_quality: float | None = None) -> tuple[CurvePoint, bool]:
    """(the chosen point, whether the goal is met) for one goal."""
    if (target_budget is None) == (min_quality is None):
        raise RouterError("choose tau for one goal: a target-call budget or a quality to match")
    if target_budget is not None:
        if not 0 <= target_budget <= 1:
            raise RouterError(f"target budget must be a share within 0..1, got {target_budget}")
        within = [c for c in curve if c.target_call_share <= target_budget]
        return min(within, key=lambda c: c.tau), True  # 1.01 (never route) is always within
    rated = [c for c in curve if c.mean_quality is not None]
    if not rated:
        raise RouterError("no rated steps to match a rating with; choose tau by a target budget instead")
    meeting = [c for c in rated if c.mean_quality >= min_quality - 1e-9]  # type: ignore[operator]
    if meeting:
        return min(meeting, key=lambda c: (c.target_token_share, -c.tau)), True
    return max(rated, key=lambda c: (c.mean_quality, c.tau)), False


def fit(x: Any, y: Sequence[int], *, hidden: int = 0, epochs: int = 400, lr: float = 0.05,
        weight_decay: float = 1e-3, seed: int = 0) -> tuple[Any, Any, Any]:
    """(net, mean, std): full-batch Adam on class-balanced binary cross-entropy over
    standardized features."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
    yt = torch.as_tensor(np.asarray(y, dtype=np.float32))
    mean = xt.mean(0)
    std = xt.std(0).clamp_min(1e-6) if len(xt) > 1 else torch.ones(xt.shape[1])
    xs = (xt - mean) / std
    num_pos = float(yt.sum())
    pos_weight = torch.tensor((len(yt) - num_pos) / max(num_pos, 1.0))
    net = build_net(xs.shape[1], hidden)
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    net.train()
    for _ in range(epochs):
        opt.zero_grad()
        loss = loss_fn(net(xs).squeeze(-1), yt)
        loss.backward()
        opt.step()
    return net.eval(), mean, std


@dataclass(frozen=True)
class TrainReport:
    router: LearnedRouter
    metrics: dict[str, Any]
    curve: list[CurvePoint] = field(default_factory=list)


class TrainSettings(BaseModel):
    """How a router is trained and its tau chosen (``stepspec router train``'s flags)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: Label = Field(Label.VERIFIER, description="What the router predicts: 'verifier' (the target's likelihood "
                         "verifier cut the drafted step; run `stepspec router verify` first) or 'advantage' (the "
                         "judge rated the target's step better by more than --margin).")
    margin: float = Field(0.5, description="Label 'advantage': the target's step is better by more than this rating.")
    held_out: float = Field(0.25, description="Share of the problems held out for metrics and tau.")
    seed: int = Field(0, description="Seed of the split and the weights.")
    hidden: int = Field(0, description="0: logistic regression; N: an MLP with N hidden units.")
    epochs: int = Field(400, description="Full-batch training epochs.")
    embedding: bool = Field(True, description="Use the step's MiniLM embedding as features.")
    target_budget: float | None = Field(None, description="Goal: at most this share of steps to the target (label "
                                        "'verifier' default: the verifier's cut share).")
    match_specreason: bool = Field(False, description="Goal (label 'advantage', its default): specreason's step "
                                   "rating with the fewest target tokens.")
    specreason_threshold: float = Field(7.0, description="The specreason threshold to match.")
    tau: float | None = Field(None, description="Use this tau instead of choosing one.")


def train_router(examples: Sequence[RoutingExample], settings: TrainSettings | None = None, *,
                 source: str | None = None, **options: Any) -> TrainReport:
    """Fit, measure on held-out problems, choose tau; returns the router and its numbers.
    ``settings``, or its fields as keywords (``label="advantage", epochs=300``)."""
    if settings is not None and options:
        raise TypeError("give the settings or their fields as keywords, not both")
    s = settings or _settings(options)
    usable = labelled(examples, s.label)
    _check_goal(s, usable, len(examples))
    train, test = split_by_problem(usable, s.held_out, s.seed)
    y_train, y_test = labels(train, s.label, s.margin), labels(test, s.label, s.margin)
    if len(set(y_train)) < 2:
        advantage = s.label is Label.ADVANTAGE
        raise RouterError(f"the training steps hold one class only ({sum(y_train)} of {len(y_train)} labelled "
                          f"positive by '{s.label}'{f' at margin {s.margin}' if advantage else ''}); "
                          "collect more steps" + (" or lower the margin" if advantage else ""))
    feature_set = FeatureSet(embedding=s.embedding)
    net, mean, std = fit(featurize([ex.state for ex in train], feature_set), y_train, hidden=s.hidden,
                         epochs=s.epochs, seed=s.seed)
    router = LearnedRouter(net, mean, std, feature_set, tau=0.5, hidden=s.hidden)
    p_test = [float(v) for v in router.predict_features(featurize([ex.state for ex in test], feature_set))]
    p_train = [float(v) for v in router.predict_features(featurize([ex.state for ex in train], feature_set))]
    curve = routing_curve(p_test, test)
    refs = reference_points(test, s.specreason_threshold)
    chosen, met, goal = _choose_tau(s, curve, refs, p_test, test, y_train)
    router.tau = min(1.0, chosen.tau)
    router.metadata = {
        "source": source, "label": s.label.value, "num_examples": len(examples),
        "num_unlabelled": len(examples) - len(usable), "num_problems": len({ex.problem_id for ex in usable}),
        "num_train": len(train), "num_held_out": len(test),
        "num_train_problems": len({ex.problem_id for ex in train}),
        "num_held_out_problems": len({ex.problem_id for ex in test}),
        "margin": s.margin if s.label is Label.ADVANTAGE else None,
        "positive_share_train": sum(y_train) / len(y_train),
        "positive_share_held_out": sum(y_test) / len(y_test) if y_test else None,
        "auc_train": roc_auc(y_train, p_train), "auc_held_out": roc_auc(y_test, p_test),
        "hidden": s.hidden, "epochs": s.epochs, "seed": s.seed, "embedding": s.embedding,
        "goal": goal, "goal_met": met, "tau": router.tau,
        "held_out_at_tau": _point(chosen),
        "held_out_references": {k: _point(v) for k, v in refs.items()},
    }
    return TrainReport(router, router.metadata, curve)


def _settings(options: dict[str, Any]) -> TrainSettings:
    """The settings from keywords; an unknown label named with the known ones."""
    label = options.get("label", Label.VERIFIER)
    try:
        options = {**options, "label": Label(label)}
    except ValueError:
        raise RouterError(f"unknown label '{label}'; one of {', '.join(x.value for x in Label)}") from None
    return TrainSettings(**options)


def _check_goal(s: TrainSettings, usable: Sequence[RoutingExample], num_examples: int) -> None:
    """Steps with the label's data, and exactly one way to set tau that fits the label."""
    if not usable:
        fix = ("verify them first: `stepspec router verify DATA_DIR`" if s.label is Label.VERIFIER
               else "collect them with a rating judge (score)")
        raise RouterError(f"none of the {num_examples} steps carries the '{s.label}' label's data; {fix}")
    goals = sum([s.target_budget is not None, s.match_specreason, s.tau is not None])
    if goals > 1 or (goals == 0 and s.label is Label.ADVANTAGE):
        raise RouterError("give exactly one way to set tau: a target-call budget, match specreason, or tau itself")
    if s.match_specreason and s.label is not Label.ADVANTAGE:
        raise RouterError("match specreason compares the judge's ratings: train with label 'advantage', or give "
                          "the verifier label a target-call budget")


def _choose_tau(s: TrainSettings, curve: list[CurvePoint], refs: dict[str, CurvePoint], p_test: list[float],
                test: Sequence[RoutingExample], y_train: list[int]) -> tuple[CurvePoint, bool, dict[str, Any]]:
    """The held-out point at the chosen tau, whether it meets the goal, and the goal."""
    if s.tau is not None:
        return routing_point([x >= s.tau for x in p_test], test, s.tau), True, {"tau": s.tau}
    if s.match_specreason:
        chosen, met = choose_tau(curve, min_quality=refs["specreason"].mean_quality)
        return chosen, met, {"match_specreason": True, "specreason_threshold": s.specreason_threshold}
    goal: dict[str, Any] = {"target_budget": s.target_budget}
    budget = s.target_budget
    if budget is None:  # as many target calls as specreason-likelihood makes on the training steps
        budget = sum(y_train) / len(y_train)
        goal = {"target_budget": budget, "from": "the verifier's cut share of the training steps"}
    chosen, met = choose_tau(curve, target_budget=budget)
    return chosen, met, goal


def _point(c: CurvePoint) -> dict[str, float | None]:
    return {"target_call_share": c.target_call_share, "target_token_share": c.target_token_share,
            "mean_quality": c.mean_quality, "missed_cut_share": c.missed_cut_share}
