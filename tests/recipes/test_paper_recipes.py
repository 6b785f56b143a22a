"""The paper's recipes (configs/paper/, docs/paper.md): each loads and validates at full scale
without the model, each value agrees with the value its comment cites, each runs one RL step at
smoke scale (``--smoke``: the tiny model and capped sizes, every other setting kept), and the
pre-flight refuses a model that is not downloaded and a GPU count the state cannot fit."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vagent.config import ConfigError, from_mapping
from vagent.eval.config import load_config as load_eval_config
from vagent.eval.config import load_yaml, resolve_seeds
from vagent.runconfig import load_config
from tests.recipes.conftest import hf_metadata_dir
from vagent.recipes.scale import (
    GIB, load_scaled, preflight, read_smoke, share_lines, smoke_overrides, state_bytes_per_gpu,
)

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "configs" / "paper"
ENVS = ("sokoban", "frozenlake", "navigation", "primitive_skill", "svg")
METHODS = ("vagen_full", "vagen_base", "grpo_mask", "turn_ppo")
RECIPES = [f"{env}_{method}" for env in ENVS for method in METHODS]
SOURCE = re.compile(r"VAGEN@d2b8b30 \S+:\d+|docs/\S+\.md|paper, Finding 2|the env's revision turns|"
                    r"the training recipe|GRPO's")


def test_the_folder_holds_exactly_the_table():
    names = {p.stem for p in PAPER.glob("*.yaml")}
    assert names == {*RECIPES, *(f"eval_{env}" for env in ENVS), "smoke"}


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_loads_and_validates_at_full_scale(name):
    cfg = load_config(PAPER / f"{name}.yaml")  # envs checked against their Config; the model is not touched
    assert cfg.model.path == "Qwen/Qwen2.5-VL-3B-Instruct" and cfg.dist.nproc == 4 and cfg.steps == 300
    assert sum(e.n_train for e in cfg.envs) * cfg.rollout.group_size == 128  # the paper's 128 episodes a step
    assert (cfg.reasoning_reward is not None) == name.endswith("vagen_full")
    if cfg.reasoning_reward is not None:
        from vagent.rewards.reasoning import ReasoningRewardConfig

        rr = from_mapping(ReasoningRewardConfig, cfg.reasoning_reward, where="reasoning_reward")
        assert rr.judge == "llm" and rr.grounding_weight == rr.worldmodeling_weight == 0.5
    method = next(m for m in METHODS if name.endswith(m))
    if method == "grpo_mask":
        assert cfg.recipe == "grpo" and cfg.grpo.estimator == "grpo"
    else:
        estimator = {"vagen_full": "bi_level_gae", "vagen_base": "masked_gae", "turn_ppo": "turn_gae"}[method]
        assert cfg.recipe == "ppo" and cfg.ppo.estimator == estimator


def _cited(comment: str) -> str | None:
    """``= VALUE, ...`` / ``= VALUE: ...`` / ``= VALUE (...)`` -> VALUE (a [list] is taken whole)."""
    m = re.match(r"=\s*(\[[^\]]*\]|.+?)(?:,\s|:\s|\s\(|$)", comment)
    return m.group(1).strip() if m else None


def _value(text: str):
    div = re.fullmatch(r"([\d.e+-]+)\s*/\s*([\d.e+-]+)", text)
    if div:
        return float(div.group(1)) / float(div.group(2))
    if re.fullmatch(r"[\d.]+e[+-]?\d+", text):  # YAML 1.1 reads 1e-6 as a string
        return float(text)
    return yaml.safe_load(text)


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


@pytest.mark.parametrize("name", RECIPES)
def test_every_value_agrees_with_the_value_its_comment_cites(name):
    """Each ``key: value  # = CITED, ... (SOURCE)`` line: value == CITED, and a source is named;
    every value line but a few structural ones carries such a comment."""
    uncited_ok = {"name", "seed", "base_url"}
    checked = 0
    for n, line in enumerate((PAPER / f"{name}.yaml").read_text().splitlines(), 1):
        if line.lstrip().startswith("#") or ":" not in line:
            continue
        body, _, comment = line.partition("  # ")
        key, _, raw = body.strip().lstrip("- ").partition(":")
        if not raw.strip():  # a section header
            continue
        if key in uncited_ok or key == "cpu_offload":  # cpu_offload: a note on VAGEN's offload, no value cited
            continue
        assert comment.startswith("= "), f"{name}.yaml:{n}: {key} cites no value ('# = VALUE, ... (SOURCE)')"
        cited = _cited(comment)
        assert cited is not None and _same(_value(raw.strip()), _value(cited)), \
            f"{name}.yaml:{n}: {key} is {raw.strip()} but its comment cites {cited}"
        assert SOURCE.search(comment), f"{name}.yaml:{n}: {key}'s comment names no source"
        checked += 1
    assert checked >= 35


def test_the_comment_check_catches_a_drifted_value(tmp_path):
    """The parser above reads a drifted value as a mismatch (the check has teeth)."""
    line = "  actor_lr: 1.0e-5                  # = 1e-6, actor_rollout_ref.actor.optim.lr (VAGEN@d2b8b30 x.sh:85)"
    body, _, comment = line.partition("  # ")
    assert not _same(_value(body.split(":", 1)[1].strip()), _value(_cited(comment)))
    assert _value(_cited("= 128 / 32: episodes per step")) == 4


@pytest.mark.parametrize("env", ENVS)
def test_eval_recipe_loads(env):
    cfg = load_eval_config(load_yaml(PAPER / f"eval_{env}.yaml"))
    assert {m.model for m in cfg.models} >= {"gpt-5", "claude-sonnet-4-5", "gemini-2.5-pro"}
    assert sum(len(resolve_seeds(e.seeds, e.name)) for e in cfg.envs) == 128  # the paper's test_size
    train = load_config(PAPER / f"{env}_vagen_full.yaml")
    assert cfg.max_turns == train.rollout.max_turns and cfg.sampling.max_new_tokens == train.rollout.max_new_tokens
    assert [{k: v for k, v in e.config.items()} for e in cfg.envs] == \
        [{k: v for k, v in e.config.items() if k != "format"} for e in train.envs]


def _flat(obj, prefix=""):
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flat(val, f"{prefix}{key}.").items()}
    if isinstance(obj, list) and obj and isinstance(obj[0], dict):
        return {k: v for i, val in enumerate(obj) for k, v in _flat(val, f"{prefix}{i}.").items()}
    return {prefix[:-1]: obj}


def _smoke_keys(key: str, spec) -> bool:
    pattern = re.sub(r"^envs\.\d+\.", "envs.N.", key)
    name = key.rsplit(".", 1)[-1]
    return (pattern in spec.set or pattern in spec.cap or key in spec.set
            or (key.startswith("envs.") and ".config." in key and name in spec.env_defaults))


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-cache")


@pytest.mark.parametrize("name", RECIPES)
def test_one_rl_step_at_smoke_scale_keeps_every_other_setting(name, tmp_path, tiny_cache):
    from vagent.recipes.run import train

    full = load_config(PAPER / f"{name}.yaml")
    cfg = load_scaled(str(PAPER / f"{name}.yaml"), [f"model.cache_dir={tiny_cache}", f"out_dir={tmp_path}",
                                                    "threads=1", "log.plots=false"], smoke=True)
    spec = read_smoke()
    a, b = _flat(full), _flat(cfg)
    changed = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} - {"model.cache_dir", "out_dir", "threads", "log.plots"}
    assert changed and all(_smoke_keys(k, spec) for k in changed), sorted(k for k in changed if not _smoke_keys(k, spec))
    assert cfg.model.path == "tiny" and cfg.steps == 1
    run = train(cfg, quiet=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rl = [r for r in records if r.get("step") == 1 and any(k.startswith("loss/") for k in r)]
    assert rl, f"{name}: no RL step in metrics.jsonl"
    assert all(math.isfinite(v) for r in rl for k, v in r.items() if k.startswith("loss/") and isinstance(v, float))


def test_smoke_caps_only_shrink_and_backends_fall_back_to_cpu():
    nav = smoke_overrides(load_config(PAPER / "navigation_turn_ppo.yaml"))
    assert 'envs.0.config.backend="raycast"' in nav and "rollout.group_size=2" not in nav  # turn-PPO's 2 stays
    ps = smoke_overrides(load_config(PAPER / "primitive_skill_grpo_mask.yaml"))
    assert "rollout.group_size=2" in ps and sum("backend=\"kinematic\"" in o for o in ps) == 4
    assert not any(o.startswith("reasoning_reward") for o in smoke_overrides(load_config(PAPER / "svg_vagen_base.yaml")))


# --- bad input -------------------------------------------------------------------------------------


def test_a_model_not_downloaded_fails_before_any_work_with_the_download_command(tmp_path):
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "empty-cache"), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "vagent", "train", "--config", str(PAPER / "sokoban_vagen_full.yaml"),
                           "--nproc", "2", f"out_dir={out}"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "hf download Qwen/Qwen2.5-VL-3B-Instruct" in proc.stderr
    assert "torchrun" not in proc.stderr.lower() and not out.exists()  # refused before the job and the run directory



def test_fewer_gpus_say_the_share_per_gpu_and_refuse_where_the_state_cannot_fit(tmp_path):
    cfg = load_config(PAPER / "sokoban_vagen_full.yaml", [f"model.path={hf_metadata_dir(tmp_path)}"])
    said: list[str] = []
    preflight(cfg, 4, gpu_bytes=80 * GIB, say=said.append)  # as written: fits, no share line
    assert len(said) == 1 and "of 80 GiB" in said[0]
    with pytest.raises(ConfigError, match=r"does not fit 2 GPU\(s\) of 80 GiB.*run on 3 GPUs or more.*cpu_offload"):
        preflight(cfg, 2, gpu_bytes=80 * GIB, say=said.append)
    assert "each GPU plays up to 64 of the step's 128 episodes (written: 32)" in said[-1]
    offload = load_config(PAPER / "sokoban_vagen_full.yaml", [f"model.path={cfg.model.path}", "dist.cpu_offload=true"])
    said.clear()
    preflight(offload, 1, gpu_bytes=80 * GIB, say=said.append)
    assert "each GPU plays up to 128" in said[0] and "of 80 GiB" in said[-1]
    # GRPO: no critic, so two GPUs hold it
    grpo = load_config(PAPER / "sokoban_grpo_mask.yaml", [f"model.path={cfg.model.path}"])
    assert state_bytes_per_gpu(grpo, int(3.75e9), 2) <= 0.9 * 80 * GIB < state_bytes_per_gpu(cfg, int(3.75e9), 2)
    assert share_lines(grpo, 4) == []
