"""``vagent eval RUN_DIR``: a training run's checkpoint evaluated on the run's own envs, seeds and
sampling, through the CLI's main(); checkpoints evaluated on other env settings get a warning;
a missing model directory is one line before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vagent.cli import build_parser, main
from vagent.eval.cli import build_mapping, check_training_envs
from vagent.eval.config import load_config

#: the run's env differs from frozenlake's defaults (96 px, natural descriptions) like the default run's
RUN_ENV = {"image_size": 64, "description_style": "symbolic", "reward_progress": 0.5}
#: the run's env config without its format (the default preset's render: vision stays)
EVAL_ENV = {"render": "vision", **RUN_ENV}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A one-step PPO run of a tiny VLM with validation before and after the step, and a checkpoint."""
    from vagent.models.tiny import build_tiny_vlm

    tmp = tmp_path_factory.mktemp("run")
    model = build_tiny_vlm(tmp / "tiny-vlm", hidden=64, layers=2, image_size=64)
    overrides = [f"envs.0.config.{k}={v}" for k, v in RUN_ENV.items()] + [
        "steps=1", "sft.steps=0", "val.every=1", "threads=1", f"model.path={model}", "envs.0.n_train=1",
        "envs.0.n_val=4", "rollout.max_turns=2", "rollout.max_new_tokens=12", "update.epochs=1",
        "update.mini_batches=1", "update.warmup_steps=0", "ppo.critic_warmup_steps=0", "log.tensorboard=false",
        "log.progress=false", "log.plot_every=0", "log.plots=false", f"out_dir={tmp / 'runs'}", "name=tiny"]
    assert main(["train", "--quiet", *overrides]) == 0
    (run,) = (tmp / "runs").iterdir()
    return run


def _args(*argv: str):
    return build_parser().parse_args(["eval", *argv])


def test_eval_of_a_run_repeats_its_validation(run_dir, capsys):
    assert main(["eval", str(run_dir)]) == 0
    assert "warning" not in capsys.readouterr().err
    summary = json.loads((run_dir / "eval" / "step_000001" / "summary.json").read_text())
    used = summary["run"]
    assert used["envs"] == [{"label": "frozenlake", "name": "frozenlake", "config": EVAL_ENV}]
    assert used["formats"] == ["grounding_worldmodeling"] and used["max_turns"] == 2
    assert (used["sampling"]["temperature"], used["sampling"]["max_new_tokens"]) == (0.0, 12)
    assert used["training_run"]["checkpoint"] == "step_000001" and used["training_run"]["overridden"] == []
    assert {"envs", "sampling", "models", "max_turns"} <= set(used["training_run"]["from_run"])
    (cell,) = summary["cells"]
    assert cell["episodes"] == cell["finished"] == 4 and cell["model_id"].endswith("step_000001/policy")
    # the final validation ran the same policy on the same 4 val seeds, greedy: the same numbers
    val = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in val if r.get("phase") == "rl" and "val/success_rate" in r][-1]
    assert last["step"] == 1
    assert (cell["success_rate"], cell["mean_return"], cell["mean_turns"], cell["format_accuracy"]) == (
        last["val/success_rate"], last["val/return"], last["val/turns"], last["val/format_accuracy"])


def test_flags_override_the_run_and_are_recorded(run_dir, capsys):
    cfg = load_config(build_mapping(_args(str(run_dir / "checkpoints" / "step_000001"), "--seeds", "test:3",
                                          "--env-config", "image_size=96", "--max-new-tokens", "20")))
    assert cfg.envs[0].config == {**EVAL_ENV, "image_size": 96} and cfg.seeds == ["test:3"]
    assert cfg.sampling.max_new_tokens == 20 and cfg.sampling.temperature == 0.0 and cfg.max_turns == 2
    assert {"envs", "sampling"} <= set(cfg.training_run["overridden"]) and "max_turns" in cfg.training_run["from_run"]
    check_training_envs(cfg)
    err = capsys.readouterr().err
    assert "image_size 96 (eval) vs 64 (training)" in err and "description_style" not in err
    assert cfg.training_run["warnings"] and Path(cfg.out_dir) == run_dir / "eval" / "step_000001"


def test_a_checkpoint_evaluated_on_the_env_defaults_gets_a_warning(run_dir, capsys):
    """The docs' `--backend hf --model .../policy --env frozenlake` (96 px, natural descriptions)."""
    policy = run_dir / "checkpoints" / "step_000001" / "policy"
    cfg = load_config(build_mapping(_args("--backend", "hf", "--model", str(policy), "--env", "frozenlake")))
    check_training_envs(cfg)
    err = capsys.readouterr().err
    assert "[eval] warning: model policy: env frozenlake (grounding_worldmodeling) is not the env the checkpoint " \
           "was trained on" in err
    assert "image_size 96 (eval) vs 64 (training)" in err and "description_style 'natural' (eval) vs 'symbolic'" in err
    assert cfg.training_run["run_dir"] == str(run_dir)


def test_missing_model_dir_is_one_line_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", "--backend", "hf", "--model", str(tmp_path / "no-such-model"), "--env", "frozenlake",
                 "--seeds", "val:1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no-such-model" in err and "does not exist" in err
    assert not out.exists()


def test_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "is not a training run" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_damaged_checkpoint_is_not_evaluated(run_dir, tmp_path, capsys):
    """A byte flipped in the exported policy: the checkpoint's manifest names the file, and nothing
    is evaluated (the run has no other checkpoint)."""
    import shutil

    run = Path(shutil.copytree(run_dir, tmp_path / run_dir.name))
    shutil.rmtree(run / "eval", ignore_errors=True)  # what the tests above wrote
    f = run / "checkpoints" / "step_000001" / "policy" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    assert main(["eval", str(run / "checkpoints" / "step_000001")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "step_000001 is damaged: policy/model.safetensors does not match" in err
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert "warning: checkpoint" in err and "has no intact checkpoint: step_000001: policy/model.safetensors" in err
    assert not (run / "eval").exists()
