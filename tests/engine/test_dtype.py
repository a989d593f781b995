"""dtype="auto": the fastest dtype on the machine at hand, chosen by its CPU flags and a timed
probe cached per CPU model and matrix shape (stepspec/engine/dtype.py). The probe itself is stood in
for here; tests/engine/test_pair.py runs the real engines in whatever auto picks."""

import json

import pytest

import stepspec.engine.dtype as dtype_module
from stepspec.engine.dtype import MIN_GAIN, cached_probe, choose_dtype, model_shape


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A stand-in CPU (name, bf16 flags) and probe (decode, prefill speedups), counting its runs."""
    state = {"cpu": ("Test CPU", ("avx512_bf16", "amx_bf16")), "speedups": (1.8, 6.0), "probes": 0}

    def probe(hidden, intermediate):
        state["probes"] += 1
        decode, prefill = state["speedups"]
        return {"shape": [hidden, intermediate], "decode_speedup": decode, "prefill_speedup": prefill}

    monkeypatch.setattr(dtype_module, "cpu_info", lambda: state["cpu"])
    monkeypatch.setattr(dtype_module, "probe", probe)
    monkeypatch.setattr(dtype_module, "cache_dir", lambda: tmp_path)
    pytest.importorskip("torch")  # the cache key names torch's version and threads
    return state


def model(tmp_path, hidden=896, intermediate=4864):
    folder = tmp_path / f"m{hidden}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": hidden, "intermediate_size": intermediate}))
    return str(folder)


def test_a_dtype_given_outright_is_kept_and_a_gpu_leaves_auto_to_vllm(machine, tmp_path):
    assert choose_dtype("float32", model(tmp_path), cpu=True).dtype == "float32"
    gpu = choose_dtype("auto", model(tmp_path, 1536), cpu=False)
    assert gpu.dtype == "auto" and "GPU" in gpu.reason and machine["probes"] == 0


def test_a_cpu_without_native_bf16_computes_in_float32_without_a_probe(machine, tmp_path):
    machine["cpu"] = ("AMD EPYC 7B12", ())
    choice = choose_dtype("auto", model(tmp_path), cpu=True)
    assert choice.dtype == "float32" and "AMD EPYC 7B12" in choice.reason and "no native bf16" in choice.reason
    assert machine["probes"] == 0


def test_native_bf16_is_chosen_when_the_probe_confirms_it_once_per_cpu_and_shape(machine, tmp_path):
    small, large = model(tmp_path), model(tmp_path, 1536, 8960)
    choice = choose_dtype("auto", small, cpu=True)
    assert choice.dtype == "bfloat16" and choice.cpu == "Test CPU" and "1.80x (decode)" in choice.reason
    assert choose_dtype("auto", small, cpu=True) == choice and machine["probes"] == 1  # cached
    choose_dtype("auto", large, cpu=True)
    assert machine["probes"] == 2  # another shape, another probe
    saved = json.loads((tmp_path / dtype_module.PROBE_FILE).read_text())
    assert len(saved) == 2 and all(key.startswith("Test CPU | ") for key in saved)


@pytest.mark.parametrize("speedups", [(MIN_GAIN - 0.05, 6.0), (1.8, 0.4)])
def test_flags_without_a_measured_gain_in_decode_and_prefill_mean_float32(machine, tmp_path, speedups):
    machine["speedups"] = speedups
    choice = choose_dtype("auto", model(tmp_path), cpu=True)
    assert choice.dtype == "float32" and choice.reason.endswith("float32")


def test_a_broken_probe_cache_is_measured_again_and_a_model_without_config_gets_the_default_shape(machine, tmp_path):
    (tmp_path / dtype_module.PROBE_FILE).write_text("{not json")
    assert cached_probe("Test CPU", (8, 16))["shape"] == [8, 16] and machine["probes"] == 1
    assert model_shape(str(tmp_path / "nowhere")) == dtype_module.DEFAULT_SHAPE
    assert model_shape(model(tmp_path, 64, 256)) == (64, 256)
