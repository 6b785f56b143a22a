"""Caption pretraining of the tiny VLM: captions pair the env's own observation with the symbolic
state; a few steps change the weights and save the model in place."""

from __future__ import annotations

import json
import shutil

import torch

from vagent.envs import make
from vagent.envs.frozenlake import describe_state
from vagent.recipes.tiny_cache import tiny_model_dir
from vagent.runconfig import EnvEntry, ModelConfig
from vagent.recipes.pretrain import CaptionStage, caption_records, pretrain_captions


def test_captions_are_the_env_observation_and_its_grid(tmp_path):
    (tmp_path / "images").mkdir()
    entry = EnvEntry("frozenlake", {"image_size": 64, "description_style": "symbolic"})
    recs = caption_records([entry], 4, seed=0, image_dir=tmp_path / "images")
    assert len(recs) == 4
    for r in recs:
        user, target = r["messages"]
        assert user["role"] == "user" and user["content"].count("<image>") == len(r["images"]) == 1
        assert target["content"].startswith("<think><observation>") and target["content"].endswith("</observation>")
        grid = target["content"][len("<think><observation>"):-len("</observation>")]
        assert len(grid.splitlines()) == 4 and any(c in grid for c in "P*X")
        assert (tmp_path / r["images"][0]).is_file()
    # the first record's state is reproducible from its seed (no moves drawn for it or a few)
    env = make("frozenlake", image_size=64, description_style="symbolic")
    env.reset(int(recs[0]["images"][0].split("_")[1]))
    assert describe_state(env.state(), "symbolic").count("G") + describe_state(env.state(), "symbolic").count("*") == 1


def test_pretraining_updates_and_saves_the_model(tmp_path, tiny_vlm):
    from vagent.models.loading import load_policy

    model_dir = tmp_path / "tiny"
    shutil.copytree(tiny_vlm, model_dir)
    before = {k: v.clone() for k, v in load_policy(model_dir).model.state_dict().items()}
    said: list[str] = []
    summary = pretrain_captions(model_dir, [EnvEntry("frozenlake", {"image_size": 64})],
                                CaptionStage(steps=3, batch_size=2, n_per_env=4), say=said.append)
    # one progress line per step here (3 steps), each with elapsed time and ETA
    assert [s.split(" [")[0] for s in said] == [f"caption pretraining (grid) {k}/3" for k in (1, 2, 3)]
    assert all(", ETA " in s and "loss=" in s for s in said) and "ETA 0s]" in said[-1]
    after = load_policy(model_dir).model.state_dict()
    assert summary["steps"] == 3 and json.loads((model_dir / "vagent_pretrain.json").read_text())["grid"]["captions"] == 4
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_cache_key_depends_on_pretraining():
    plain = tiny_model_dir(ModelConfig(cache_dir="/c"))
    pre = tiny_model_dir(ModelConfig(cache_dir="/c", tiny_pretrain_steps=100), [EnvEntry()])
    # the model's own pretraining env settings change the captions: another cached model
    pre_other_env = tiny_model_dir(ModelConfig(cache_dir="/c", tiny_pretrain_steps=100,
                                               tiny_pretrain_env_config={"description_style": "natural"}), [EnvEntry()])
    assert len({plain, pre, pre_other_env}) == 3
    # the run's env config (render knobs, rewards) does not: the same cached model
    shaped = tiny_model_dir(ModelConfig(cache_dir="/c", tiny_pretrain_steps=100),
                            [EnvEntry(config={"render": "text", "image_size": 64, "reward_progress": 0.5})])
    assert shaped == pre
    # the rotary base changes the model: its own cache entry (0 = the family's base, the old names)
    assert tiny_model_dir(ModelConfig(cache_dir="/c", tiny_rope_theta=100)) != plain
    assert tiny_model_dir(ModelConfig(cache_dir="/c", tiny_rope_theta=0)) == plain


def test_two_stage_pretraining_adds_relations_on_fresh_boards(tmp_path):
    """tiny_pretrain_relation_steps: the grid stage (no relations), then a relations stage on boards
    the grid stage never showed; both are recorded and the cache key tells them apart."""
    from vagent.recipes.tiny_cache import prepare_model
    m = ModelConfig(cache_dir=str(tmp_path), tiny_family="qwen2_5_vl", tiny_hidden=32, tiny_layers=1,
                    tiny_image_size=56, tiny_pretrain_steps=2, tiny_pretrain_batch=2,
                    tiny_pretrain_relations=["goal"], tiny_pretrain_relation_steps=2)
    env = [EnvEntry("frozenlake", {"image_size": 56, "description_style": "symbolic"})]
    out = prepare_model(m, env, say=lambda s: None)
    stages = json.loads((out / "vagent_pretrain.json").read_text())
    assert set(stages) == {"grid", "relations"} and stages["relations"]["captions"] == 2 * 2
    grid = [json.loads(x) for x in (out / "pretrain" / "grid" / "captions.jsonl").read_text().splitlines()]
    rel = [json.loads(x) for x in (out / "pretrain" / "relations" / "captions.jsonl").read_text().splitlines()]
    assert all("<reasoning>" not in r["messages"][1]["content"] for r in grid)
    assert all("<reasoning>The goal is" in r["messages"][1]["content"] for r in rel)
    boards = lambda recs: {r["images"][0].split("_")[1] for r in recs}  # noqa: E731
    assert not boards(grid) & boards(rel)
    one_stage = tiny_model_dir(ModelConfig(cache_dir=str(tmp_path), **{k: getattr(m, k) for k in (
        "tiny_family", "tiny_hidden", "tiny_layers", "tiny_image_size", "tiny_pretrain_steps", "tiny_pretrain_batch",
        "tiny_pretrain_relations")}), env)
    assert one_stage != out and prepare_model(m, env, say=lambda s: None) == out  # cached: built once


def test_prepare_model_builds_with_the_configured_rope_theta(tmp_path):
    from vagent.recipes.tiny_cache import prepare_model
    m = ModelConfig(cache_dir=str(tmp_path), tiny_family="qwen3_vl", tiny_hidden=32, tiny_layers=1, tiny_rope_theta=100)
    out = prepare_model(m, say=lambda s: None)
    assert out.name.endswith("-rope100")
    assert json.loads((out / "config.json").read_text())["text_config"]["rope_parameters"]["rope_theta"] == 100.0
