"""Shared fixtures, and the rule that markers say what a test needs (pyproject.toml):

* ``vllm``: the test needs vLLM itself (it starts a real engine or imports vllm); every
  ``pair`` and every ``server`` test is also ``vllm``. Where vLLM is not installed these
  tests are skipped, so ``pytest -m "not vllm"`` needs only ``pip install stepspec[dev]``.
* torch, transformers, sentence-transformers and the other optional extras, where a test
  needs them without vLLM: ``pytest.importorskip`` inside the test or a fixture.
* Nothing heavy at collection: test modules import vllm/torch/transformers lazily.

Enforced here: a test without the ``vllm`` marker that imports vllm fails, naming
the marker; a test module that imports vllm, torch or transformers when it is collected
is a usage error; a ``pair`` test outside a ``test_pair*.py`` file fails, naming the move;
a ``whole_machine`` test fails beside other test workers.
"""

import asyncio
import importlib.util
import os
import sys
from pathlib import Path

import pytest

# Offline and loopback-only, whatever the caller's environment.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "support"))  # the helpers the tests share

HEAVY = ("vllm", "torch", "transformers")
_LOADED_BEFORE_COLLECTION = {m for m in HEAVY if m in sys.modules}  # by a plugin, say: not ours to judge


def pytest_collection_finish(session):
    loaded = sorted(m for m in HEAVY if m in sys.modules and m not in _LOADED_BEFORE_COLLECTION)
    if loaded:
        raise pytest.UsageError(
            f"collecting the tests imported {', '.join(loaded)}: import them inside the tests or fixtures "
            "that need them (pytest.importorskip), so that `pytest -m 'not vllm'` runs without them")


_VLLM_WAS_LOADED = pytest.StashKey[bool]()


def _check_unmarked_vllm_import(item) -> None:
    if not item.stash[_VLLM_WAS_LOADED] and "vllm" in sys.modules and not item.get_closest_marker("vllm"):
        pytest.fail(f"{item.nodeid} imported vllm but is not marked `vllm`: add @pytest.mark.vllm "
                    "(and `pair` or `server` where it needs the bundled pair or a server)", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("pair") and _work_unit(item.nodeid) != PAIR_FILES:
        pytest.fail(f"{item.nodeid} is marked `pair` outside a {PAIR_FILES}*.py file: move it into one "
                    "(the pair's tests run one at a time, on one test worker)", pytrace=False)
    if item.get_closest_marker("whole_machine") and WORKERS > 1:
        pytest.fail(f"{item.nodeid} needs the machine's memory to itself: run it without -n, alone "
                    "(`make test` runs `-m whole_machine` after the others)", pytrace=False)
    if item.get_closest_marker("vllm") and importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM (marker `vllm`): pip install 'stepspec[cpu]' or 'stepspec[gpu]'")
    item.stash[_VLLM_WAS_LOADED] = "vllm" in sys.modules
    result = yield  # the fixtures: an unmarked test's fixture that imports vllm is caught too
    _check_unmarked_vllm_import(item)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    _check_unmarked_vllm_import(item)
    return result


# `make test` runs two pytest-xdist workers (`-n 2`). Each works on cores of its own (vLLM
# binds its threads to the cores a process may use), so two engines never share a core. A
# test file is a unit of work (its module fixtures start their engines once), except that
# every test of the bundled pair lives in a `test_pair*.py` file and all of those are one
# unit, started first, on one worker: at most one pair is in memory (two do not fit in CI's
# 24 GiB beside the rest). xdist_group markers cannot say this: pytest 9 ignores the node
# ids pytest-xdist 3.8 rewrites for them.
PAIR_FILES = "test_pair"
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set before xdist's workers load this file


def _work_unit(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return PAIR_FILES if Path(path).name.startswith(PAIR_FILES) else path


def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...
    cores = sorted(os.sched_getaffinity(0))
    if worker and 1 < WORKERS <= len(cores):
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) :: WORKERS])


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class PairApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            if PAIR_FILES in self.workqueue:  # the longest unit first
                self.workqueue.move_to_end(PAIR_FILES, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            if not all(self.assigned_work[node].get(PAIR_FILES, {}).values()):  # nothing beside the pair
                return
            super()._reschedule(node)

    return PairApart(config, log)


@pytest.fixture
def torch():
    """torch (it comes with vLLM), or the test is skipped where it is not installed."""
    return pytest.importorskip("torch")


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
    from stepspec.engine.vllm_backend import VLLMEngine

    kwargs.setdefault("max_model_len", 512)
    kwargs.setdefault("kv_cache_gib", 0.25)
    kwargs.setdefault("engine_args", {"enforce_eager": True})
    return VLLMEngine(str(path), **kwargs)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory, runner):
    """(draft, target): two tiny random models on real vLLM (one tokenizer, different seeds),
    started once per module that asks; the target reads up to 512 logprobs (the whole tiny
    vocabulary, for the score judge's top_k)."""
    from tiny_models import build_tiny_model

    paths = [build_tiny_model(tmp_path_factory.mktemp(f"pair{seed}"), seed=seed, weight_std=0.5,
                              tie_word_embeddings=False) for seed in (0, 1)]
    target = tiny_engine(paths[0], name="target", max_logprobs=512)
    draft = tiny_engine(paths[1], name="draft")
    runner.run(target.start())
    runner.run(draft.start())
    try:
        yield draft, target
    finally:
        runner.run(target.close())
        runner.run(draft.close())
