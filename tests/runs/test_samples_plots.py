"""Saved rollouts (JSONL + PNG, size-capped) and learning-curve plots."""

from __future__ import annotations

import json

from PIL import Image

from vagent.envs.base import Observation
from vagent.envs.formats import parse_response
from vagent.rollout.records import Episode, Turn
from vagent.runs.metrics import MetricsLogger
from vagent.runs.plots import plot_run
from vagent.runs.samples import save_rollouts, save_validation


def _episode(i: int) -> Episode:
    noise = Image.effect_noise((64, 64), 50 + i).convert("RGB")  # incompressible-ish frames
    obs = Observation("see <image>", (noise,))
    reply = "<answer>Left</answer>"
    turn = Turn(index=0, observation=obs, reply=reply, parsed=parse_response(reply, "no_think"), env_reward=1.0,
                reward=1.0, terminated=True, truncated=False, info={"success": True},
                state_before={"player": (0, 1)}, state_after={"player": (0, 0)})
    return Episode("frozenlake", {"format": "no_think"}, seed=i, group_id=i, traj_id=i, system_prompt="sys",
                   turns=[turn], terminated=True)


def test_rollouts_jsonl_and_frames(tmp_path):
    path = save_rollouts(tmp_path, 3, [_episode(i) for i in range(3)], n=2, max_mb=10)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(recs) == 2 and path.name == "step_000003.jsonl"
    t = recs[0]["turns"][0]
    assert t["reply"] == "<answer>Left</answer>" and t["parsed"]["actions"] == ["Left"] and t["format_ok"]
    assert t["state_before"] == {"player": [0, 1]} and t["reward"] == 1.0 and recs[0]["success"]
    assert (tmp_path / t["frames"][0]).is_file()


def test_rollouts_folder_is_size_capped(tmp_path):
    cap_mb = 0.02  # ~20 kB: a few frames fit, then frames stop being written
    for step in range(10):
        save_rollouts(tmp_path, step, [_episode(step)], n=1, max_mb=cap_mb)
    recs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.jsonl"))]
    assert recs[0]["frames_skipped"] is False and recs[-1]["frames_skipped"] is True
    pngs = sum(f.stat().st_size for f in tmp_path.rglob("*.png"))
    assert pngs < cap_mb * 1024 * 1024 + 20_000  # at most one frame past the cap


def test_validation_episodes_all_saved_with_frames_and_judge_reasons(tmp_path):
    eps = [_episode(i) for i in range(5)]
    eps[0].turns[0].reasoning_rewards, eps[0].turns[0].reasoning_scores = {"grounding": 0.5}, {"grounding": 1.0}
    eps[0].turns[0].judge_reasons = {"grounding": "rule judge (natural, 1 claim) 1.00: goal F1 1.00"}
    path = save_validation(tmp_path, 20, eps, max_mb=10)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert path.name == "val_000020.jsonl" and [r["seed"] for r in recs] == [0, 1, 2, 3, 4]  # every episode
    t = recs[0]["turns"][0]
    assert t["frames"] == ["val_000020/e0_t0_0.png"] and (tmp_path / t["frames"][0]).is_file()
    assert t["judge_reasons"] == {"grounding": "rule judge (natural, 1 claim) 1.00: goal F1 1.00"}
    assert recs[1]["turns"][0]["judge_reasons"] == {} and not recs[0]["frames_skipped"]
    # the same cap as the training dumps: past it, the records are written without frames
    save_rollouts(tmp_path, 0, [_episode(9)], n=1, max_mb=10)
    capped = [json.loads(x) for x in save_validation(tmp_path, 40, eps, max_mb=0.001).read_text().splitlines()]
    assert len(capped) == 5 and all(r["frames_skipped"] and r["turns"][0]["frames"] == [] for r in capped)
    assert not (tmp_path / "val_000040").exists()


def test_plots_are_written(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for s in range(4):
        log.log(s, {"sft/loss": 3.0 - s}, phase="sft")
    for s in range(5):
        log.log(s, {"reward/mean": s / 5, "loss/policy": -0.1 * s, "val/success_rate": s / 10,
                    "val/frozenlake/success_rate": s / 10})
    files = plot_run(tmp_path / "metrics.jsonl", tmp_path / "plots")
    assert {f.name for f in files} == {"curves.png", "val.png"}
    assert all(Image.open(f).size[0] > 100 for f in files)
