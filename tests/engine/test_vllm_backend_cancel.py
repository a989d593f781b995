"""Cancelling requests of the in-process vLLM backend, on a stand-in for vLLM's AsyncLLM
(vLLM is imported for its SamplingParams; no model loads)."""

import asyncio

import pytest

from stepspec.engine.types import GenerationRequest, Sampling
from stepspec.engine.vllm_backend import VLLMEngine

pytestmark = pytest.mark.vllm


class HangingLLM:
    """AsyncLLM's surface that a request touches: generate never finishes; abort and
    shutdown are recorded."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.started = asyncio.Event()
        self.shut = False

    async def generate(self, prompt, params, request_id):
        self.started.set()
        await asyncio.Event().wait()
        yield None  # pragma: no cover - never reached

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def shutdown(self, timeout: float) -> None:
        self.shut = True


async def cancel_hanging_request(close_first: bool) -> HangingLLM:
    """Cancels a request that waits on the stand-in; raises what the request raised, unless
    that is the cancellation itself."""
    llm = HangingLLM()
    engine = VLLMEngine("unused", name="e", llm=llm)
    task = asyncio.create_task(engine.generate([GenerationRequest([1, 2, 3], Sampling(max_tokens=4))]))
    await llm.started.wait()
    if close_first:  # Ctrl-C in a bench: the engines close while their requests still wait
        await engine.close()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):  # was, after close: AttributeError, 'NoneType' has no 'abort'
        await task
    return llm


def test_cancelling_a_request_of_an_open_engine_aborts_it():
    llm = asyncio.run(cancel_hanging_request(close_first=False))
    assert llm.aborted == ["e-0"] and not llm.shut


def test_cancelling_a_request_after_the_engine_closed_raises_only_the_cancellation():
    llm = asyncio.run(cancel_hanging_request(close_first=True))
    assert llm.shut and llm.aborted == []
