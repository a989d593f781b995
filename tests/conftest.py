import asyncio
import os
import sys
from pathlib import Path

import pytest

# Offline and loopback-only, whatever the caller's environment.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    """A tiny random Qwen2 model folder (built once per test session)."""
    from tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def runner():
    """One event loop for a module, so engines started in a fixture outlive a test."""
    with asyncio.Runner() as r:
        yield r


def tiny_engine(path, **kwargs):
    from engine.vllm_backend import VLLMEngine

    kwargs.setdefault("max_model_len", 512)
    kwargs.setdefault("kv_cache_gib", 0.25)
    kwargs.setdefault("engine_args", {"enforce_eager": True})
    return VLLMEngine(str(path), **kwargs)
