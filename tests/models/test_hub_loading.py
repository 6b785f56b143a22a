"""Hub ids in model.path: the Hugging Face cache (offline), the error when a model is not there,
and the model.* loading fields from a run config."""

from __future__ import annotations

import shutil

import pytest

from vagent.models.loading import ModelNotAvailable, is_hub_id, load_policy, resolve_model_path


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache in tmp_path, offline (tests/conftest.py sets HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def put_in_cache(cache, repo_id: str, model_dir) -> None:
    """Lay ``model_dir`` out as the cache's snapshot of ``repo_id`` (what a download leaves)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_what_counts_as_a_hub_id(tmp_path):
    assert is_hub_id("Qwen/Qwen2.5-VL-3B-Instruct")
    for local in ("./Qwen/x", "/models/x", "~/x/y", "tiny", "a/b/c", str(tmp_path)):
        assert not is_hub_id(local)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not is_hub_id(tmp_path / "org" / "name")  # an existing directory stays a directory


def test_offline_missing_model_names_the_cache_and_the_fixes(hub_cache):
    with pytest.raises(ModelNotAvailable) as info:
        load_policy("someone/not-cached-vl")
    msg = str(info.value)
    for needle in ("'someone/not-cached-vl'", str(hub_cache), "HF_HUB_OFFLINE", "local model directory",
                   "hf download someone/not-cached-vl"):
        assert needle in msg, needle


def test_cached_hub_id_loads_offline(hub_cache, tiny_vlm_dir):
    put_in_cache(hub_cache, "me/tiny-vl", tiny_vlm_dir)
    path = resolve_model_path("me/tiny-vl")
    assert path.parent.name == "snapshots" and (path / "config.json").is_file()
    loaded = load_policy("me/tiny-vl")
    assert loaded.is_vision and loaded.encoder.chat_template_source == "chat_template.jinja"


def test_run_config_model_fields_reach_the_model(hub_cache, tiny_vlm_dir, tmp_path):
    """model.path as a hub id, min/max_pixels, attn_implementation and trust_remote_code from a run
    config, through prepare_model / load_model (what `vagent train` calls)."""
    from vagent.config import ConfigError
    from vagent.recipes.common import load_model
    from vagent.recipes.tiny_cache import prepare_model
    from vagent.runconfig import load_config

    put_in_cache(hub_cache, "me/tiny-vl", tiny_vlm_dir)
    cfg = load_config(None, ["model.path=me/tiny-vl", "model.min_pixels=3136", "model.max_pixels=12544",
                             "model.attn_implementation=eager", "model.trust_remote_code=true",
                             "model.max_context_tokens=2048"])
    path = prepare_model(cfg.model, cfg.envs)
    assert path.parent.name == "snapshots"
    loaded = load_model(cfg, path, __import__("torch").device("cpu"))
    assert (loaded.encoder.min_pixels, loaded.encoder.max_pixels) == (3136, 12544)
    assert loaded.model.config._attn_implementation == "eager"
    assert loaded.encoder.image_token_count(224, 224) < loaded.encoder.image_token_count(96, 96) * 25
    with pytest.raises(ConfigError, match="min_pixels .* must be <= model.max_pixels"):
        load_config(None, ["model.min_pixels=5000", "model.max_pixels=4000"])
    with pytest.raises(ConfigError, match="max_context_tokens .* must exceed rollout.max_new_tokens"):
        load_config(None, ["model.max_context_tokens=50"])


def test_train_cli_with_a_missing_hub_id_fails_with_the_fix(hub_cache, capsys):
    from vagent.cli import main

    assert main(["train", "model.path=someone/not-cached-vl", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "HF_HUB_OFFLINE" in err and str(hub_cache) in err
