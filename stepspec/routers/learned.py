"""``learned``: a small trained classifier predicts when the target would write a better step.

Arbitrage (2025) routes each step by the target's predicted advantage. Here the
predictor is logistic regression (``hidden=0``) or a one-hidden-layer MLP over
:mod:`stepspec.routers.features`, trained by :mod:`stepspec.routers.train` on stepspec's own
collected steps. It outputs p_target; a step goes to the target when
p_target >= tau.

A router file is one ``torch.save`` of plain tensors and values (loaded with
``weights_only=True``: no code runs on load): format tag, feature set version
and names, standardization, weights, architecture, tau, and the training
metadata (data, label margin, held-out metrics, how tau was chosen).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, ClassVar, Sequence

from pydantic import Field

from stepspec.common.files import atomic_write
from stepspec.routers.base import Action, Decision, RouterError, RouterOptions, RoutingState
from stepspec.routers.features import FEATURE_VERSION, FeatureSet, featurize

FORMAT = "stepspec-router"
FORMAT_VERSION = 1


class LearnedOptions(RouterOptions):
    """What may be set when a router file is loaded (the rest is the trained file)."""

    owner: ClassVar[str] = "router 'learned'"

    tau: float | None = Field(None, ge=0, le=1, description="a step goes to the target when p_target >= tau; "
                              "None: the tau the file was saved with")


def build_net(num_features: int, hidden: int):
    import torch

    if hidden < 0:
        raise RouterError(f"hidden must be >= 0 (0: logistic regression), got {hidden}")
    if hidden == 0:
        return torch.nn.Linear(num_features, 1)
    return torch.nn.Sequential(torch.nn.Linear(num_features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))


class LearnedRouter:
    name = "learned"

    def __init__(self, net: Any, mean: Any, std: Any, feature_set: FeatureSet, tau: float, hidden: int,
                 metadata: dict[str, Any] | None = None) -> None:
        LearnedOptions.build(tau=tau)  # tau's range is declared there, once
        self.net = net.eval()
        self.mean, self.std = mean, std
        self.feature_set = feature_set
        self.tau = tau
        self.hidden = hidden
        self.metadata = dict(metadata or {})

    def predict_features(self, x: Any) -> Any:
        """p_target for each row of a feature matrix (numpy, columns ``feature_set.names``)."""
        import numpy as np
        import torch

        with torch.no_grad():
            t = (torch.as_tensor(np.asarray(x, dtype=np.float32)) - self.mean) / self.std
            return torch.sigmoid(self.net(t)).squeeze(-1).numpy()

    def predict(self, states: Sequence[RoutingState]) -> Any:
        return self.predict_features(featurize(states, self.feature_set))

    async def route(self, states: Sequence[RoutingState]) -> list[Decision]:
        # in a thread: the embedding model computes while the event loop serves the engines
        probs = await asyncio.to_thread(self.predict, states)
        return [Decision(Action.TARGET if p >= self.tau else Action.KEEP, float(p), self.name) for p in probs]

    def save(self, path: str | os.PathLike) -> Path:
        import torch

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "feature_version": self.feature_set.version, "embedding": self.feature_set.embedding,
            "feature_names": list(self.feature_set.names), "hidden": self.hidden, "tau": float(self.tau),
            "mean": self.mean, "std": self.std, "state_dict": self.net.state_dict(), "metadata": self.metadata,
        }
        atomic_write(path, lambda tmp: torch.save(payload, tmp))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, options: LearnedOptions | None = None, **overrides: Any) -> "LearnedRouter":
        """A router file; ``options`` (or keywords validated through :class:`LearnedOptions`:
        ``tau``) override what it was saved with."""
        options = LearnedOptions.build(options, **overrides)
        import torch

        path = Path(path)
        if not path.is_file():
            raise RouterError(f"router file {path} does not exist; train one with `stepspec router train`")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a truncated file, another format: say which file and why
            raise RouterError(f"{path} is not a readable stepspec router file ({type(e).__name__}: {e}); "
                              "train one with `stepspec router train`") from e
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise RouterError(f"{path} is not a stepspec router file (no '{FORMAT}' format tag)")
        if payload["format_version"] != FORMAT_VERSION:
            raise RouterError(f"{path} is router file format {payload['format_version']}; this stepspec reads "
                              f"format {FORMAT_VERSION}: retrain it with `stepspec router train`")
        feature_set = FeatureSet(payload["feature_version"], payload["embedding"])
        if feature_set.version != FEATURE_VERSION:
            raise RouterError(
                f"{path} was trained on router feature set version {feature_set.version}; this stepspec computes "
                f"version {FEATURE_VERSION}. Retrain it on the same collected data (the examples keep the raw "
                f"inputs): `stepspec router train DATA_DIR --out {path}`")
        if tuple(payload["feature_names"]) != feature_set.names:
            raise RouterError(f"{path} lists features that differ from feature set version {feature_set.version}; "
                              "the file is damaged or was edited: retrain it")
        net = build_net(len(feature_set.names), payload["hidden"])
        net.load_state_dict(payload["state_dict"])
        tau = payload["tau"] if options.tau is None else options.tau
        return cls(net, payload["mean"], payload["std"], feature_set, tau, payload["hidden"], payload["metadata"])
