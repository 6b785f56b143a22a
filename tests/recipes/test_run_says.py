"""What a run says about itself, without a model: its name follows its envs, and its summary says
"after SFT" only when SFT ran and how many ranks the job had."""

from __future__ import annotations

import json

from vagent.runconfig import load_config, preset_dir


def test_a_run_is_named_after_its_envs_and_recipe_unless_named():
    assert load_config().name == "frozenlake-ppo"  # the default preset sets no name
    assert load_config(None, ["envs.0.name=sokoban", "envs.0.config={}"]).name == "sokoban-ppo"
    assert load_config(None, ["name=mine", "envs.0.name=sokoban", "envs.0.config={}"]).name == "mine"
    assert load_config(preset_dir() / "frozenlake_grpo.yaml").name == "frozenlake-grpo"


def _metrics(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_summary_says_after_sft_only_when_sft_ran_and_the_ranks(tmp_path):
    from vagent.recipes.run import format_summary, summarize
    from vagent.runs.rundir import RunDir

    run = RunDir(tmp_path).make()
    val = [{"phase": "rl", "step": s, "time": 0.0, "val/success_rate": v} for s, v in ((0, 0.25), (2, 0.5))]
    _metrics(run.metrics, val)
    plain = summarize(run, 90.0)
    text = format_summary(plain)
    assert plain["ranks"] == 1 and "on 1 ranks" not in text
    assert "0.250 at RL step 0 (before any update) -> 0.500 at the end" in text and "SFT" not in text
    _metrics(run.metrics, [{"phase": "sft", "step": 1, "time": 0.0, "sft/loss": 1.5}, *val])
    after = summarize(run, 90.0, ranks=2)
    text = format_summary(after)
    assert after["ranks"] == 2 and "wall time: 1.5 min on 2 ranks" in text
    assert "0.250 at RL step 0 (after SFT)" in text and "SFT: 1 steps, final loss 1.500" in text
