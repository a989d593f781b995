"""The vLLM plugin that repairs sampled token-level speculation on the CPU build.

The end-to-end proof (sampled suffix speculation on the real 1.5B) is
``test_pair.py::test_sampled_suffix_speculation_writes_the_targets_text``;
here: the replacement's contract and its wiring.
"""

from importlib.metadata import entry_points

import pytest


@pytest.fixture
def cpu_sampling_fix(torch):
    from stepspec.engine import cpu_sampling_fix  # imports torch

    return cpu_sampling_fix


def test_expands_per_request_values_to_their_tokens(torch, cpu_sampling_fix):
    x = torch.tensor([0.8, 0.0, 1.3])
    out = cpu_sampling_fix.expand_batch_to_tokens(
        x, torch.tensor([2, 5, 6], dtype=torch.int32), 6, replace_from=0, replace_to=1
    )
    assert out.dtype == x.dtype
    assert out.tolist() == pytest.approx([0.8, 0.8, 1.0, 1.0, 1.0, 1.3])
    # the caller's tensor is not modified
    assert x.tolist() == pytest.approx([0.8, 0.0, 1.3])


def test_requests_without_tokens_and_integer_values(torch, cpu_sampling_fix):
    top_k = torch.tensor([5, 7, 9, 11], dtype=torch.int32)
    out = cpu_sampling_fix.expand_batch_to_tokens(top_k, torch.tensor([0, 2, 2, 3]), 3)
    assert out.dtype == torch.int32
    assert out.tolist() == [7, 7, 11]


def test_mismatched_lengths_are_an_error(torch, cpu_sampling_fix):
    with pytest.raises(ValueError, match="3 values for 2 requests"):
        cpu_sampling_fix.expand_batch_to_tokens(torch.ones(3), torch.tensor([1, 2]), 2)


def test_declared_as_a_vllm_plugin():
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("stepspec_cpu_sampling_fix") == "stepspec.engine.cpu_sampling_fix:register"


@pytest.mark.vllm
def test_register_patches_the_rejection_sampler_on_cpu_only(cpu_sampling_fix):
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    before = rejection_sampler.expand_batch_to_tokens
    try:
        cpu_sampling_fix.register()
        cpu_sampling_fix.register()  # idempotent
        if current_platform.is_cpu():
            assert rejection_sampler.expand_batch_to_tokens is cpu_sampling_fix.expand_batch_to_tokens
        else:
            assert rejection_sampler.expand_batch_to_tokens is before
    finally:
        rejection_sampler.expand_batch_to_tokens = before
