"""The run presets: the repository's configs/ folder and the default run, embedded so that
``vagent train`` with no arguments works from any directory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from vagent.runconfig.sections import RunConfig


def preset_dir() -> Path:
    """The repository's configs/ folder (present in a source checkout)."""
    return Path(__file__).resolve().parents[2] / "configs"


def training_presets(folder: str = "") -> list[str]:
    """Names of the run configs in :func:`preset_dir` (``folder``: its subfolder, e.g. "paper" for
    the paper's recipes) (files whose top-level keys are all RunConfig fields: configs/eval_example.yaml,
    a ``vagent eval`` config, is not one, nor configs/paper/smoke.yaml)."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    out = []
    where = preset_dir() / folder
    for path in sorted(where.glob("*.yaml")) if where.is_dir() else []:
        try:
            tree = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(tree, dict) and tree and set(tree) <= fields:
            out.append(path.stem)
    return out


def missing_config_hint(name: str) -> str:
    """What to pass instead of a --config file ``name`` that does not exist: the closest preset or
    paper recipe ("did you mean"), an example, and every preset and paper recipe by name."""
    import difflib

    presets, paper = training_presets(), training_presets("paper")
    paths = {**{n: f"configs/{n}.yaml" for n in presets}, **{n: f"configs/paper/{n}.yaml" for n in paper}}
    close = difflib.get_close_matches(Path(name).stem, list(paths), n=1, cutoff=0.6)
    return ((f" Did you mean {paths[close[0]]}?" if close else "")
            + " Pass a YAML file, e.g. --config configs/frozenlake_ppo.yaml"
            + (f"; the paper's recipes are configs/paper/<name>.yaml, <name> one of {', '.join(paper)}" if paper else "")
            + f" (presets: {', '.join(presets) or 'none found'}).")


# The default preset, mirrored from configs/frozenlake_ppo.yaml so that `vagent train` with no
# arguments works from any directory (tests/recipes/test_config.py checks the two agree).
DEFAULT_PRESET_YAML = """\
# THE DEFAULT RUN (`vagent train` with no arguments). FrozenLake 4x4 with 128 px image
# observations and the grounding_worldmodeling format (symbolic grid descriptions), a tiny VLM:
#   1. build the tiny Qwen3-VL (random weights; 3 layers, rotary base 100) and caption-pretrain it
#      in two stages: read the board (image -> grid, 300 steps), then also say where the goal is
#      from that grid (500 steps on fresh boards); cached under ~/.cache/vagent, so later runs
#      skip it;
#   2. SFT on demonstrations whose <observation>/<reasoning>/<prediction> come from the true state
#      and half of whose actions are random (random_action_frac 0.5): SFT teaches the format, to
#      describe the board and the goal's direction, and a noisy policy that RL sharpens;
#   3. PPO with bi-level GAE, a value head on the policy's own backbone (critic_backbone: shared:
#      one forward gives log-probs and values, the head trains on its features), KL (k3) to the
#      SFT model in the loss, rollouts at temperature 0.7 (log-probs scored at the same
#      temperature, turns after the first reuse the KV cache), and FrozenLake's optional progress
#      shaping (reward_progress: 0.5 per move closer to the goal; success rates never include it)
#      with a short turn horizon (gamma_turn 0.5). Greedy validation on 128 boards at steps 0/10/20.
# Measured numbers and the learning curve: docs/training.md ("Measured"). No name: the run is named
# after its envs and recipe (frozenlake-ppo; corridor-ppo when envs.0.name=corridor).
recipe: ppo
steps: 20
seed: 0
threads: 2  # fixed, so that a seed gives the same numbers on any machine (docs/training.md, Reproducibility)
model:
  path: tiny
  tiny_family: qwen3_vl
  tiny_hidden: 128
  tiny_layers: 3
  tiny_rope_theta: 100
  tiny_image_size: 128
  tiny_pretrain_steps: 300
  tiny_pretrain_relations: [goal]
  tiny_pretrain_relation_steps: 500
envs:
  - name: frozenlake
    config: {format: grounding_worldmodeling, render: vision, image_size: 128, description_style: symbolic,
             reward_progress: 0.5}
    n_train: 16
    n_val: 128
rollout:
  group_size: 1
  max_turns: 4
  max_new_tokens: 96
  temperature: 0.7
update:
  actor_lr: 3.0e-4
  warmup_steps: 2
  epochs: 2
  mini_batches: 2
  micro_batch_tokens: 4096  # packed micro-batches of several rows: 1.3x the throughput of 1024 padded
  packing: true             # (docs/training.md, Packing)
  entropy_coef: 0.001
  kl_coef: 0.1
  kl_kind: k3
  kl_in: loss
ppo:
  estimator: bi_level_gae
  gamma_turn: 0.5
  whiten_advantages: true
  critic_lr: 5.0e-4
  critic_warmup_steps: 2
  critic_backbone: shared
sft:
  steps: 300
  demos_per_env: 512
  random_action_frac: 0.5
  actions_per_turn: 2
  reasoning_objects: [goal]
  batch_size: 8
  lr: 1.0e-3
val:
  every: 10
log:
  rollouts_every: 10
  checkpoint_every: 10
  plot_every: 5
"""


def default_preset_dict() -> dict:
    """The default preset as a plain tree (what :data:`DEFAULT_PRESET_YAML` parses to)."""
    return yaml.safe_load(DEFAULT_PRESET_YAML)


#: the default pipeline with every phase kept, a few steps each (about a minute on 2 cores): the
#: golden reproducibility test's run (tests/recipes/test_reproducible.py) and bench/busy_cpu.py's
#: ``train`` workload, as ``vagent train`` overrides. Its golden files were recorded with the padded
#: 1,024-token micro-batches the default used before it turned on packing at 4,096 tokens; the last
#: two pins keep them valid on every CPU that has one (a file can be re-recorded only on its own
#: CPU). Packed = padded within 1e-5 is tests/models/test_packing.py and
#: tests/recipes/test_packing_runs.py; the pins' budget changes SFT's micro-batches too.
SCALED_DEFAULT_OVERRIDES = (
    "model.tiny_pretrain_steps=12", "model.tiny_pretrain_relation_steps=8", "sft.steps=4", "sft.demos_per_env=12",
    "steps=2", "envs.0.n_train=4", "envs.0.n_val=6", "val.every=1", "log.rollouts_every=1", "log.checkpoint_every=1",
    "log.plot_every=0", "log.plots=false", "log.progress=false", "log.tensorboard=false",
    "update.packing=false", "update.micro_batch_tokens=1024",
)
