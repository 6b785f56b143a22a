"""The first run's model build says once how long it will take, from the pace of its first steps
(issue 56: ~25 minutes on a busy machine, with no word of it)."""

from __future__ import annotations

import re
import time

from vagent.runconfig import EnvEntry, ModelConfig
from vagent.recipes.pretrain import PACE_STEPS, Pace
from vagent.recipes.tiny_cache import about, prepare_model, say_estimate

ESTIMATE = re.compile(r"^the model build will take about (\d+) (seconds|minutes?) in all at this machine's pace now "
                      r"\(\d+\.\d\d s a step over the first steps; \S+ so far\); the pace changes with the machine's load$")


def test_the_estimate_is_the_time_so_far_plus_the_steps_left_at_the_first_pace():
    """800 steps in two stages (the default's 300 + 500), 6 done at 2 s a step, 60 s so far, the
    first stage's set-up 30 s: 60 + 794 x 2 + 30 = 1678 s, about 28 minutes."""
    said: list[str] = []
    say_estimate(Pace(step_s=2.0, steps_done=6, setup_s=30.0), time.perf_counter() - 60, 800, 2, said.append)
    (line,) = said
    assert ESTIMATE.match(line) and "about 28 minutes" in line and "2.00 s a step" in line, line
    assert [about(s) for s in (4, 44, 89, 91, 3600)] == [
        "about 10 seconds", "about 40 seconds", "about 1 minute", "about 2 minutes", "about 60 minutes"]


def test_a_tiny_build_says_its_estimate_once_after_its_first_steps(tmp_path):
    m = ModelConfig(cache_dir=str(tmp_path), tiny_family="qwen2_5_vl", tiny_hidden=32, tiny_layers=1,
                    tiny_image_size=56, tiny_pretrain_steps=PACE_STEPS + 3, tiny_pretrain_batch=2,
                    tiny_pretrain_relations=["goal"], tiny_pretrain_relation_steps=2)
    said: list[str] = []
    prepare_model(m, [EnvEntry("frozenlake", {"image_size": 56, "description_style": "symbolic"})], say=said.append)
    estimates = [i for i, line in enumerate(said) if line.startswith("the model build will take")]
    assert len(estimates) == 1 and ESTIMATE.match(said[estimates[0]]), said
    assert float(ESTIMATE.match(said[estimates[0]]).group(1)) > 0
    # said after the grid stage's step 1 + PACE_STEPS, before its last step and the relations stage
    before = [line.split(" [")[0] for line in said[:estimates[0]] if line.startswith("caption pretraining")]
    assert before and before[-1] == f"caption pretraining (grid) {PACE_STEPS + 1}/{PACE_STEPS + 3}", said
