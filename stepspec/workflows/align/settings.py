"""What an alignment run is: the pair, the problems, the LoRA and its training (saved in
align.json; a resumed run must match it), and the files of its work folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from stepspec.engine.models import BUNDLED_DRAFT_BASE
from stepspec.engine.speculation import TokenMethod
from stepspec.orchestrator.config import ReasonerConfig, RunSettings
from stepspec.workflows.eval.training_problems import DEFAULT_GENERATORS, GENERATORS


class AlignError(ValueError):
    """An alignment cannot start or resume; the message names the problem and the fix."""


class AlignSettings(RunSettings):
    """``stepspec draft align``'s settings: the engine pair and budget of the target's
    solutions (:class:`stepspec.orchestrator.config.RunSettings`), and the stages' own."""

    draft: str | None = Field(BUNDLED_DRAFT_BASE, description="The draft to align: preset, local path or hub id "
                              "(default: the base the bundled draft was aligned from).")
    name: str | None = Field(None, description="Name of the aligned draft (a model preset once made); default: "
                             "the draft's name with '-aligned'.")
    # Under load (many solutions at once) the target decodes fastest with suffix decoding.
    target_spec: TokenMethod = Field(TokenMethod.SUFFIX.value, description="Token-level speculation inside the target "
                                     "while it writes the solutions (many at once): none, ngram, suffix, draft.")
    max_tokens: int = Field(512, ge=1, description="Token budget of each solution.")
    num_problems: int = Field(800, ge=2, description="Generated training problems (the target solves each once).")
    seed: int = Field(0, description="Seed of the generated problems and of training.")
    generators: list[str] = Field(list(DEFAULT_GENERATORS), description="reasoning-gym generators the problems "
                                  f"come from: {', '.join(GENERATORS)}.")
    data_dir: str | None = Field(None, description="Folder with the evaluation sets (checked for near duplicates).")
    held_out: float = Field(0.1, gt=0, lt=0.5, description="Share of the kept solutions held out to measure loss "
                            "and agreement.")
    concurrency: int = Field(32, ge=1, description="Problems the target solves at once.")
    lora_rank: int = Field(8, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(16, ge=1, description="LoRA alpha (the update is scaled by alpha / rank).")
    lora_dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input.")
    lora_modules: list[str] = Field(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                    description="The draft's linear layers that get an adapter.")
    epochs: float = Field(2.0, gt=0, description="Passes over the training solutions.")
    learning_rate: float = Field(2e-4, gt=0, description="Peak learning rate (linear warm-up, linear decay).")
    batch_tokens: int = Field(4096, ge=64, description="Tokens per optimizer step (whole solutions, accumulated).")
    max_length: int = Field(1024, ge=32, description="Longest training example in tokens (prompt and solution); "
                            "longer ones are skipped.")
    train_dtype: str = Field("auto", description="What training computes in: auto (bfloat16 where this CPU has "
                             "native bf16 or on a GPU, float32 elsewhere), bfloat16, float32.")
    checkpoint_every: int = Field(10, ge=1, description="Optimizer steps between checkpoints.")

    @model_validator(mode="after")
    def _known(self) -> "AlignSettings":
        if unknown := [g for g in self.generators if g not in GENERATORS]:
            raise ValueError(f"unknown generator(s) {unknown}; choose from {', '.join(GENERATORS)}")
        if self.draft is None:
            raise ValueError("align needs a draft model to align")
        return self

    @property
    def aligned_name(self) -> str:
        return self.name or f"{Path(str(self.draft)).name}-aligned"

    def reasoner_config(self, **settings: Any) -> ReasonerConfig:
        """The reasoner that writes the solutions: the target alone, greedy."""
        return super().reasoner_config(strategy="target-only", max_concurrency=self.concurrency, **settings)


@dataclass(frozen=True)
class AlignFiles:
    """A work folder: every stage's output, each written so an interrupted stage resumes."""

    directory: Path

    def __truediv__(self, name: str) -> Path:
        return self.directory / name

    @property
    def config(self) -> Path:
        return self / "align.json"

    @property
    def problems(self) -> Path:
        return self / "problems.jsonl"

    @property
    def solutions(self) -> Path:
        return self / "solutions.jsonl"

    @property
    def manifest(self) -> Path:
        return self / "manifest.json"

    @property
    def checkpoint(self) -> Path:
        return self / "checkpoint"

    @property
    def adapter(self) -> Path:
        return self / "adapter"

    @property
    def evaluation(self) -> Path:
        return self / "evaluation.json"
