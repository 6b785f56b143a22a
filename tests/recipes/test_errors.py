"""Clear errors: missing model directory, text-only model for an image env, NaN/inf (stop, keep the
last good checkpoint, name the quantity)."""

from __future__ import annotations

import pytest
import torch

from vagent.cli import main
from vagent.recipes.run import train
from vagent.runs import NonFiniteError, list_checkpoints

from .conftest import small_overrides


def test_missing_model_dir(tmp_path, capsys, tiny_vlm):
    args = small_overrides(tmp_path, tiny_vlm, f"model.path={tmp_path / 'no-such-model'}")
    assert main(["train", "--quiet", *args]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and "vagent model init-tiny" in err
    assert not (tmp_path / "runs").exists()  # no run directory for a run that could not start


def test_text_only_model_for_an_image_env(tmp_path, capsys, tiny_vlm, tiny_lm):
    args = small_overrides(tmp_path, tiny_vlm, f"model.path={tiny_lm}")
    assert main(["train", "--quiet", *args]) == 1
    err = capsys.readouterr().err
    assert "text-only" in err and "envs.0.config.render=text" in err
    # the same model trains on the text render of the env
    run = train(__import__("vagent.runconfig", fromlist=["x"]).load_config(
        None, small_overrides(tmp_path, tiny_vlm, f"model.path={tiny_lm}", "envs.0.config.render=text", "steps=1")),
        quiet=True)
    assert (run / "summary.json").is_file()


@pytest.fixture(scope="module")
def inf_model(tmp_path_factory, tiny_vlm):
    """The tiny VLM with one weight of its first decoder layer set to inf, saved as a model directory."""
    from vagent.models.loading import load_policy

    loaded = load_policy(tiny_vlm)
    name, param = next((n, p) for n, p in loaded.model.named_parameters() if "layers.0.mlp" in n)
    with torch.no_grad():
        param.view(-1)[0] = float("inf")
    out = tmp_path_factory.mktemp("models") / "inf-vlm"
    loaded.model.save_pretrained(out)
    for f in tiny_vlm.iterdir():
        if not (out / f.name).exists():
            (out / f.name).write_bytes(f.read_bytes())
    return out


def test_nan_in_sft_loss_stops_the_run(tmp_path, small_cfg, inf_model):
    from vagent.runconfig import load_config

    cfg = load_config(None, small_overrides(tmp_path, inf_model, "recipe=sft", "sft.steps=3", "sft.demos_per_env=2",
                                            "sft.batch_size=2"))
    with pytest.raises(NonFiniteError, match=r"sft/loss became nan at sft step 1.*No checkpoint was written yet"):
        train(cfg, quiet=True)


def test_nan_weights_in_rollout_are_named(tmp_path, inf_model):
    from vagent.runconfig import load_config

    cfg = load_config(None, small_overrides(tmp_path, inf_model, "steps=2"))
    with pytest.raises(NonFiniteError, match=r"policy weights \(.*layers\.0\.mlp.*\) became inf at rl step 0"):
        train(cfg, quiet=True)


def test_blow_up_keeps_the_last_good_checkpoint(tmp_path, tiny_vlm):
    """One good SFT step (checkpoint written), then an absurd actor lr makes the first PPO update
    overflow the forward pass of the second epoch: the run stops before another optimizer step or
    checkpoint and names the good checkpoint."""
    from vagent.runconfig import load_config

    cfg = load_config(None, small_overrides(tmp_path, tiny_vlm, "sft.steps=1", "sft.demos_per_env=2",
                                            "sft.batch_size=2", "update.epochs=2"))
    cfg.update.actor_lr = 1e30  # set past the config's range check (it refuses 1e30): the NaN guard is under test
    with pytest.raises(NonFiniteError, match=r"loss/policy became nan at rl step 1.*sft_000001") as info:
        train(cfg, quiet=True)
    run = next((tmp_path / "runs").iterdir())
    assert [(c.phase, c.step) for c in list_checkpoints(run / "checkpoints")] == [("sft", 1)]
    assert str(info.value) in (run / "train.log").read_text()
