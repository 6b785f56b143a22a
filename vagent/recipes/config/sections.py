"""The declared run config: one dataclass tree, one YAML file per run, ``key=value`` overrides.

A run config is a :class:`RunConfig`; every field is documented by the ``#:`` comment above it
(``vagent train --describe`` prints them, ``docs/configuration.md`` lists them). Unknown keys are
errors with a "did you mean" (``vagent.config.from_mapping``). Overrides on the command line are
dotted paths into the tree, with list indices as numbers::

    vagent train --config configs/frozenlake_ppo.yaml steps=20 ppo.estimator=turn_gae \\
        envs.0.config.render=text update.actor_lr=3e-4

Values are parsed as YAML scalars (``true``, ``3e-4``, ``[1, 2]``, ``null``). The resolved config
is printed at start-up and saved as ``config.yaml`` in the run directory; ``--resume`` reads it
back from there.

Sources of the defaults: VAGEN (docs/algorithms.md reference section 6) for PPO (clip 0.2, entropy 0.001,
gamma_token 1.0, gamma_turn 0.95, lam 1.0, grad clip 1.0, value clip 0.5) and ViGoRL for GRPO
(clip-higher 0.2/0.28, dual-clip 3, KL in loss k3). Learning rates are NOT the paper's (1e-6 /
1e-5 for a 3B model): the tiny CPU models need much larger ones, set per preset.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from vagent.config import ConfigError, _suggest, from_mapping, to_dict

#: the PPO advantage estimators (``vagent.recipes.ppo.PPO_ESTIMATORS`` maps each to its function)
PPOEstimator = Literal["masked_gae", "bi_level_gae", "turn_gae", "no_concat_gae"]
#: the critic-free estimators (``vagent.recipes.grpo.GRPO_ESTIMATORS``)
GRPOEstimator = Literal["grpo", "rloo", "reinforce_pp", "gigpo"]

@dataclass
class ModelConfig:
    """Which policy to train and how to load it."""

    #: model directory or hub id (e.g. Qwen/Qwen2.5-VL-3B-Instruct: the Hugging Face cache, downloaded
    #: on first use; offline, HF_HUB_OFFLINE=1 uses the cache only); "tiny" builds (or reuses) a tiny
    #: random-weight VLM under cache_dir
    path: str = "tiny"
    #: where "tiny" models are built and reused (~ is expanded)
    cache_dir: str = "~/.cache/vagent"
    #: tiny model family: qwen2_5_vl, qwen2_vl, qwen3_vl (path "tiny" only)
    tiny_family: str = "qwen2_5_vl"
    #: tiny model hidden size (path "tiny" only)
    tiny_hidden: int = 128
    #: tiny model attention heads (head size = tiny_hidden / tiny_heads; key/value heads = half of them,
    #: at least 1). vLLM's CPU attention serves head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256 and
    #: 512 only: the default 128 / 4 = 32 works (path "tiny" only)
    tiny_heads: int = 4
    #: tiny model decoder layers (path "tiny" only)
    tiny_layers: int = 2
    #: tiny model largest image side in pixels (96 gives 9 image tokens; path "tiny" only)
    tiny_image_size: int = 96
    #: tiny model weight-init seed (path "tiny" only)
    tiny_seed: int = 0
    #: tiny model's language-model rotary base; 0 = the family's (1e6 Qwen2/2.5-VL, 5e6 Qwen3-VL).
    #: A small base (100) gives a tiny model's 32-dim heads fine position resolution, so it learns
    #: to read boards off the image in fewer caption steps (docs/training.md; path "tiny" only)
    tiny_rope_theta: float = 0.0
    #: caption-pretraining steps of the tiny model on boards of the run's envs (image -> symbolic state), so
    #: that it can see; cached with the model (0 = random weights; see vagent/recipes/pretrain.py)
    tiny_pretrain_steps: int = 0
    #: env config fields of the caption-pretraining boards, over the model's own settings (render
    #: vision, image_size = tiny_image_size, description_style symbolic, format
    #: grounding_worldmodeling); the run's env config is not used, so changing how the run's envs
    #: render reuses the cached model
    tiny_pretrain_env_config: dict = field(default_factory=dict)
    #: caption-pretraining learning rate
    tiny_pretrain_lr: float = 1e-3
    #: caption-pretraining batch size (images per step)
    tiny_pretrain_batch: int = 16
    #: captions also state the natural-language relation of these object types to the agent
    #: (e.g. [goal]: "... <reasoning>The goal is below and to the right of you."); with
    #: tiny_pretrain_relation_steps > 0 only in that second stage
    tiny_pretrain_relations: list[str] = field(default_factory=list)
    #: a second caption stage after the grid stage: steps on captions that add the relations
    #: above, each on a board not seen before (0 = one stage)
    tiny_pretrain_relation_steps: int = 0
    #: parameter dtype: float32, bfloat16 or float16
    dtype: str = "float32"
    #: LoRA rank; 0 trains all parameters
    lora_rank: int = 0
    #: LoRA alpha (scale = alpha / rank)
    lora_alpha: float = 16.0
    #: LoRA dropout
    lora_dropout: float = 0.0
    #: recompute activations in the backward pass (less memory, ~30% slower)
    gradient_checkpointing: bool = False
    #: keep the vision encoder (and its merger) frozen; only the language model trains
    freeze_vision: bool = False
    #: smallest image area in pixels the image processor resizes to (null = the checkpoint's
    #: preprocessor_config.json); images are resized into [min_pixels, max_pixels]
    min_pixels: int | None = None
    #: largest image area in pixels (null = the checkpoint's; fewer pixels, fewer image tokens:
    #: tokens = pixels / (patch * merge)**2, e.g. 28 * 28 px per token for Qwen2/2.5-VL)
    max_pixels: int | None = None
    #: the most tokens one sample may hold (context + rollout.max_new_tokens); a turn that would
    #: exceed it is not generated and ends the episode as truncated (finish reason context_limit);
    #: null = no limit
    max_context_tokens: int | None = None
    #: run the checkpoint's own modelling/tokenizer code (transformers trust_remote_code); only for
    #: checkpoints you trust
    trust_remote_code: bool = False
    #: attention kernel passed to from_pretrained: null (transformers' default, sdpa), eager, sdpa,
    #: flash_attention_2 (needs the flash-attn package and a GPU)
    attn_implementation: str | None = None


@dataclass
class EnvEntry:
    """One kind of environment the run trains and validates on."""

    #: registered env name (``vagent envs`` lists them)
    name: str = "frozenlake"
    #: the env's config (validated against its declared Config; ``vagent envs NAME`` lists fields)
    config: dict = field(default_factory=dict)
    #: environments of this kind per training step; each is played group_size times
    n_train: int = 8
    #: validation episodes of this kind (seeds of the ``val`` split, greedy decoding)
    n_val: int = 32
    #: ``vagent serve-env`` servers that host this entry's envs (failover in order, replay on server
    #: loss; docs/service.md); empty = the envs run in the training process
    urls: list[str] = field(default_factory=list)
    #: bearer token of the ``urls`` servers (their ``--token``); null = the environment variable
    #: VAGENT_SERVICE_TOKEN (preferred: a token written here is saved in the run's config.yaml)
    token: str | None = None


@dataclass
class RolloutConfig:
    """How episodes are played during training."""

    #: episodes per env and seed (a GRPO group); PPO usually uses 1
    group_size: int = 1
    #: turn limit per episode (reaching it truncates the episode)
    max_turns: int = 4
    #: context mode: "concat" (whole trajectory one sample) or "no_concat" (one sample per turn)
    mode: Literal["concat", "no_concat"] = "concat"
    #: concat mode: keep only the last `window` turns in the context (null = all)
    window: int | None = None
    #: the most tokens generated per turn
    max_new_tokens: int = 64
    #: sampling temperature for training rollouts (validation is greedy); RL scores log-probs at it too
    temperature: float = 1.0
    #: nucleus sampling mass
    top_p: float = 1.0
    #: top-k sampling (0 = off)
    top_k: int = 0
    #: generation stops right after the first of these strings; envs add their own (an env class's
    #: ``reply_stop``, e.g. vigorl_zoom adds "</tool_call>")
    stop: list[str] = field(default_factory=lambda: ["</answer>"])
    #: keep the KV cache between turns and feed only each turn's new tokens (HFEngine prefix reuse:
    #: same replies; 1.55x on bench/prefix_cache.py); false = every turn prefills the whole context
    prefix_cache: bool = True
    #: generation engine of training rollouts: hf (HF generate, vagent.models.engine) or vllm
    #: (vLLM V1, CUDA build on GPUs or vLLM's CPU build: scripts/vllm-env; the trainer's weights are
    #: pushed into it before each rollout; docs/distributed.md). Validation always uses the
    #: trainer's in-process model
    engine: Literal["hf", "vllm"] = "hf"
    #: engine replicas (of rollout.engine) as Ray actors (pip install 'vagent[ray]'): a trajectory's
    #: turns stay on one replica, weights are pushed before each rollout; 0 = generate in the training
    #: process (a job of several ranks with engine vllm needs >= 1)
    replicas: int = 0
    #: torch threads of each hf replica
    replica_threads: int = 1
    #: lockstep (one batched policy call per turn for the whole batch) or async (each trajectory
    #: advances as soon as its own reply and env step return; same episodes, per-request seeds)
    schedule: Literal["lockstep", "async"] = "lockstep"
    #: 1 = generate step k+1's batch with the previous weights while step k updates (staleness 1,
    #: PPO ratio against the sampling-time log-probs; needs replicas >= 1 or engine vllm); 0 = off
    overlap: int = 0
    #: engine vllm: share of the GPU's memory (vLLM's CPU build: of the RAM) each vLLM engine may
    #: take for weights + KV cache; null = the platform's default (GPU 0.4, CPU 0.1)
    vllm_gpu_memory: float | None = None


@dataclass
class UpdateConfig:
    """The policy-gradient update shared by PPO and GRPO (and the optimizer for SFT)."""

    #: actor (policy) learning rate (AdamW)
    actor_lr: float = 1e-6
    #: AdamW weight decay
    weight_decay: float = 0.0
    #: linear warm-up steps of every learning rate
    warmup_steps: int = 0
    #: learning-rate schedule after warm-up: constant, linear (to 0 at the last step) or cosine
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    #: PPO epochs over each rollout batch
    epochs: int = 1
    #: optimizer steps per epoch (the batch is split into this many mini-batches of rows)
    mini_batches: int = 1
    #: micro-batch token budget (rows x padded length) for gradient accumulation
    micro_batch_tokens: int = 8192
    #: gradient-norm clipping (0 = off)
    grad_clip: float = 1.0
    #: PPO ratio clip below 1 (1 - clip_low)
    clip_low: float = 0.2
    #: PPO ratio clip above 1 (1 + clip_high); > clip_low is "clip-higher"
    clip_high: float = 0.2
    #: dual-clip constant c > 1 bounding the loss of negative-advantage tokens (null = off)
    dual_clip: float | None = None
    #: loss aggregation: token-mean, seq-mean-token-sum or seq-mean-token-mean
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    #: entropy bonus coefficient
    entropy_coef: float = 0.001
    #: KL-to-reference coefficient (0 = no reference model is loaded)
    kl_coef: float = 0.0
    #: KL estimator: k1 (log-ratio), k2 (squared/2) or k3 (low-variance, always >= 0)
    kl_kind: Literal["k1", "k2", "k3"] = "k1"
    #: where the KL goes: "reward" (subtracted per token from the reward) or "loss"
    kl_in: Literal["reward", "loss"] = "reward"
    #: tokens per chunk when computing log-probs/entropy from logits (bounds memory)
    logprob_chunk: int = 1024


@dataclass
class PPOConfig:
    """PPO with a critic (VAGEN)."""

    #: advantage estimator: masked_gae, bi_level_gae, turn_gae or no_concat_gae
    estimator: PPOEstimator = "bi_level_gae"
    #: discount between tokens inside a turn (bi_level_gae) or between sampled tokens (masked_gae)
    gamma_token: float = 1.0
    #: discount between turns (bi_level_gae, turn_gae, no_concat_gae)
    gamma_turn: float = 0.95
    #: GAE lambda
    lam: float = 1.0
    #: no_concat_gae: token of each turn-sample whose value is used: first or last
    anchor: Literal["first", "last"] = "first"
    #: whiten advantages over the batch's loss-mask tokens
    whiten_advantages: bool = True
    #: critic learning rate (AdamW)
    critic_lr: float = 1e-5
    #: value-loss clip around the rollout-time values (0 = off)
    value_clip: float = 0.5
    #: the first N steps update only the critic (the policy waits for useful values)
    critic_warmup_steps: int = 0
    #: critic backbone: "separate" (a copy of the policy's backbone) or "shared" (one model: the
    #: value head reads the policy's scoring pass, about half the update time; the value loss trains the head only)
    critic_backbone: Literal["separate", "shared"] = "separate"
    #: reward-variance filter over groups (rollout.group_size >= 2): none, top_k (fraction of groups)
    #: or top_p (of variance); as grpo.filter, on the episodes' scores
    filter: Literal["none", "top_k", "top_p"] = "none"
    #: the filter's fraction (top_k) or variance mass (top_p) in (0, 1]
    filter_value: float = 1.0


@dataclass
class GRPOConfig:
    """Critic-free group-relative estimators (GRPO, RLOO, REINFORCE++)."""

    #: estimator: grpo, rloo, reinforce_pp or gigpo (GRPO plus step-level groups of turns that saw the
    #: same env state, keyed on env.state(); Feng et al. 2025, arXiv 2505.10978)
    estimator: GRPOEstimator = "grpo"
    #: grpo: divide by the group's reward std (false = Dr. GRPO-style mean-centering only)
    norm_by_std: bool = True
    #: reward-variance filter over groups: none, top_k (fraction of groups) or top_p (of variance)
    filter: Literal["none", "top_k", "top_p"] = "none"
    #: the filter's fraction (top_k) or variance mass (top_p) in (0, 1]
    filter_value: float = 1.0
    #: gigpo: discount of the step-level returns G_t = sum_k gamma^(k-t) r_k
    gigpo_gamma: float = 0.95
    #: gigpo: weight of the step-level advantage, A = A_episode + omega * A_step
    gigpo_omega: float = 1.0


@dataclass
class SFTConfig:
    """Supervised fine-tuning: a recipe of its own, or the warm start before RL."""

    #: optimizer steps of SFT (0 = no SFT warm start; recipe "sft" needs > 0)
    steps: int = 0
    #: JSONL chat data (docs/training.md "SFT data"); empty = solver demonstrations of the envs
    data: str = ""
    #: solver demonstrations generated when data is empty: episodes per env entry
    demos_per_env: int = 64
    #: fraction of demonstration actions replaced by random ones (keeps SFT from saturating)
    random_action_frac: float = 0.1
    #: samples (chats) per optimizer step
    batch_size: int = 8
    #: SFT learning rate (AdamW; the update section's warm-up and schedule apply)
    lr: float = 1e-4
    #: SFT turn limit of a demonstration episode
    max_turns: int = 4
    #: demonstrations: actions per reply (0 = the env's max_actions_per_turn)
    actions_per_turn: int = 0
    #: demonstrations: describe only these object types in <observation>/<prediction> (empty = all)
    describe_objects: list[str] = field(default_factory=list)
    #: demonstrations: start <reasoning> with the natural-language relation of these object types
    reasoning_objects: list[str] = field(default_factory=list)
    #: demonstrations: end <reasoning> with the plan ("I move Down, Right."); false leaves the
    #: choice to the <answer> alone
    reasoning_plan: bool = True
    #: weight of each reply's <answer>...</answer> tokens in the token-mean SFT loss (the rest
    #: weigh 1); > 1 makes the answer learn sooner to copy the plan in <reasoning>
    answer_weight: float = 1.0
    #: run the tokens every chat of a step starts with (the system prompt) once, without a graph,
    #: and each chat from there: the same loss, a stop-gradient into the shared prompt's states,
    #: fewer tokens through the backbone (docs/training.md, "Shared system prompt in SFT")
    shared_prefix: bool = False


@dataclass
class ValConfig:
    """Validation on the ``val`` seed split with greedy decoding."""

    #: validate every N RL steps (and before the first and after the last); 0 = never
    every: int = 5
    #: turn limit of validation episodes (null = rollout.max_turns)
    max_turns: int | None = None


@dataclass
class LogConfig:
    """What the run directory receives."""

    #: write TensorBoard events
    tensorboard: bool = True
    #: also log to Weights & Biases (offline mode works: WANDB_MODE=offline)
    wandb: bool = False
    #: W&B project name
    wandb_project: str = "vagent"
    #: save sampled rollouts every N steps (0 = never)
    rollouts_every: int = 5
    #: episodes saved each time
    rollouts_n: int = 4
    #: size cap of the rollouts/ folder in MB (frames stop being written beyond it)
    rollouts_max_mb: float = 50.0
    #: write a checkpoint every N steps (and at the end); 0 = only at the end
    checkpoint_every: int = 10
    #: checkpoints kept per phase (SFT, RL; older ones of the phase are deleted)
    keep_last: int = 2
    #: redraw plots/*.png every N steps
    plot_every: int = 5
    #: show the rich progress bar (off when stdout is not a terminal is fine too)
    progress: bool = True


@dataclass
class HubConfig:
    """Upload checkpoints to the Hugging Face Hub (pip install huggingface_hub; docs/metrics.md)."""

    #: target model repo, e.g. me/frozenlake-ppo (created if missing); empty = no upload
    repo_id: str = ""
    #: upload every N-th checkpoint (and the last); the upload runs in a background thread and a
    #: failure is logged and retried with the next checkpoint, never stopping training
    every: int = 1
    #: create the repo as private
    private: bool = True
    #: what to upload: policy (the exported model directory, loadable with from_pretrained) or
    #: checkpoint (the whole checkpoint: weights, optimizer states, RNG)
    what: Literal["policy", "checkpoint"] = "policy"


@dataclass
class DistConfig:
    """Runs of several processes (torchrun; docs/distributed.md); ignored by a single process."""

    #: seconds a collective waits for the other ranks before the job fails with the collective's name
    timeout_s: float = 600.0
    #: FSDP2 CPU offload: parameter shards, gradients and optimizer state in CPU memory (saves GPU memory, slower)
    cpu_offload: bool = False
    #: FSDP2 frees each layer's gathered weights after its forward and gathers them again for the backward (false: keep them, more memory, fewer all-gathers)
    reshard_after_forward: bool = True


@dataclass
class RunConfig:
    """A training run: recipe, model, environments, rollout, update, logging."""

    #: run name (the run directory is <out_dir>/<name>-<timestamp>); empty: the envs and the recipe,
    #: <env names>-<recipe> (e.g. frozenlake-ppo, corridor-ppo), set when the config is loaded
    name: str = ""
    #: recipe: ppo, grpo or sft
    recipe: Literal["ppo", "grpo", "sft"] = "ppo"
    #: RL steps (one rollout batch and its update each); SFT steps are in sft.steps
    steps: int = 30
    #: run seed: rollout seeds, sampling and data order derive from (seed, step)
    seed: int = 0
    #: parent directory of run directories
    out_dir: str = "runs"
    #: torch device: auto (cuda if available, else cpu), cpu, cuda, cuda:1 ...
    device: str = "auto"
    #: bf16 autocast for forward passes: auto (on where the device supports it), true, false
    bf16: Literal["auto", "true", "false"] = "auto"
    #: torch CPU threads (0 = torch's default)
    threads: int = 0
    #: modules to import before envs are looked up (your own envs' register calls; dotted names or
    #: .py paths; docs/custom_env.md); vagent train --import MODULE adds to it
    imports: list[str] = field(default_factory=list)
    #: the policy
    model: ModelConfig = field(default_factory=ModelConfig)
    #: environments to train and validate on
    envs: list[EnvEntry] = field(default_factory=lambda: [EnvEntry()])
    #: rollout settings
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    #: policy-update settings
    update: UpdateConfig = field(default_factory=UpdateConfig)
    #: PPO (critic) settings, used when recipe is ppo
    ppo: PPOConfig = field(default_factory=PPOConfig)
    #: GRPO settings, used when recipe is grpo
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    #: SFT settings (the recipe sft, or the warm start before ppo/grpo when steps > 0)
    sft: SFTConfig = field(default_factory=SFTConfig)
    #: validation settings
    val: ValConfig = field(default_factory=ValConfig)
    #: logging, checkpoints and plots
    log: LogConfig = field(default_factory=LogConfig)
    #: several processes (torchrun): collective timeout, FSDP2 memory options
    dist: DistConfig = field(default_factory=DistConfig)
    #: Hugging Face Hub upload of checkpoints
    hub: HubConfig = field(default_factory=HubConfig)
    #: reasoning-reward judges (vagent.rewards.ReasoningReward config), null = env rewards only
    reasoning_reward: dict | None = None


# ----------------------------------------------------------------------------------------------
# validation of values that types alone cannot check
# ----------------------------------------------------------------------------------------------


def validate(cfg: RunConfig) -> RunConfig:
    """Check every number's range (vagent.recipes.config_checks.RANGES), the run name and the
    cross-field rules; raise ConfigError naming the field and the fix."""
    from vagent.recipes.config.ranges import check_name, check_ranges

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    check_ranges(cfg)
    check_name(cfg.name)
    m = cfg.model
    need(m.tiny_hidden % m.tiny_heads == 0 and (m.tiny_hidden // m.tiny_heads) % 2 == 0
         and m.tiny_hidden // m.tiny_heads >= 8,
         f"model.tiny_hidden / model.tiny_heads is the head size and must be an even whole number >= 8, got "
         f"{m.tiny_hidden} / {m.tiny_heads}; e.g. tiny_hidden 128 with tiny_heads 4 (head size 32).")
    need(cfg.steps >= 0, f"steps must be >= 0, got {cfg.steps}.")
    need(len(cfg.envs) > 0, "envs is empty: list at least one env, e.g. envs: [{name: frozenlake}].")
    for i, e in enumerate(cfg.envs):
        need(e.n_train >= 1 or cfg.recipe == "sft", f"envs.{i}.n_train must be >= 1, got {e.n_train}.")
        need(e.n_val >= 0, f"envs.{i}.n_val must be >= 0, got {e.n_val}.")
    r = cfg.rollout
    need(r.group_size >= 1, f"rollout.group_size must be >= 1, got {r.group_size}.")
    need(r.max_turns >= 1, f"rollout.max_turns must be >= 1, got {r.max_turns}.")
    need(r.max_new_tokens >= 1, f"rollout.max_new_tokens must be >= 1, got {r.max_new_tokens}.")
    need(r.replicas >= 0 and r.replica_threads >= 1,
         f"rollout.replicas must be >= 0 and rollout.replica_threads >= 1, got {r.replicas}, {r.replica_threads}.")
    need(r.overlap in (0, 1), f"rollout.overlap must be 0 or 1 (staleness of the generator's weights), got {r.overlap}.")
    need(not (r.overlap and r.engine == "hf" and r.replicas == 0),
         "rollout.overlap 1 generates while the trainer updates, so the generator needs its own weights: set "
         "rollout.replicas >= 1 (Ray actors) or rollout.engine vllm, or rollout.overlap 0.")
    for i, e in enumerate(cfg.envs):
        bad = [u for u in e.urls if not str(u).startswith(("http://", "https://"))]
        need(not bad, f"envs.{i}.urls must be http(s) URLs of vagent serve-env servers, got {bad}.")
        need(e.token is None or bool(e.urls), f"envs.{i}.token is the bearer token of envs.{i}.urls; set urls "
             "too (the env servers), or drop the token.")
    u = cfg.update
    need(u.mini_batches >= 1 and u.epochs >= 1, "update.epochs and update.mini_batches must be >= 1.")
    need(u.micro_batch_tokens >= 16, f"update.micro_batch_tokens must be >= 16, got {u.micro_batch_tokens}.")
    need(0 <= u.clip_low < 1 and u.clip_high >= 0, "update.clip_low must be in [0, 1) and clip_high >= 0.")
    need(u.dual_clip is None or u.dual_clip > 1, f"update.dual_clip must be > 1 or null, got {u.dual_clip}.")
    need(u.actor_lr > 0, f"update.actor_lr must be > 0, got {u.actor_lr}.")
    if cfg.recipe == "ppo":
        if r.mode == "no_concat" and cfg.ppo.estimator != "no_concat_gae":
            raise ConfigError(
                f"rollout.mode is no_concat but ppo.estimator is {cfg.ppo.estimator}: each turn is its "
                "own sample there, so only ppo.estimator=no_concat_gae links the turns. Set "
                "ppo.estimator=no_concat_gae or rollout.mode=concat."
            )
        if r.mode == "concat" and cfg.ppo.estimator == "no_concat_gae":
            raise ConfigError("ppo.estimator=no_concat_gae needs rollout.mode=no_concat.")
    if cfg.recipe == "grpo":
        need(r.group_size >= 2, "recipe grpo needs rollout.group_size >= 2 (advantages are relative to "
             f"the group), got {r.group_size}.")
        need(0 < cfg.grpo.filter_value <= 1, f"grpo.filter_value must be in (0, 1], got {cfg.grpo.filter_value}.")
        need(0 <= cfg.grpo.gigpo_gamma <= 1, f"grpo.gigpo_gamma must be in [0, 1], got {cfg.grpo.gigpo_gamma}.")
    if cfg.recipe == "ppo" and cfg.ppo.filter != "none":
        need(0 < cfg.ppo.filter_value <= 1, f"ppo.filter_value must be in (0, 1], got {cfg.ppo.filter_value}.")
        need(r.group_size >= 2, "ppo.filter compares the rewards within a group: set rollout.group_size >= 2 "
             f"(got {r.group_size}) or ppo.filter none.")
    m = cfg.model
    for name in ("min_pixels", "max_pixels", "max_context_tokens"):
        need(getattr(m, name) is None or getattr(m, name) >= 1, f"model.{name} must be >= 1 or null, got {getattr(m, name)}.")
    need(m.min_pixels is None or m.max_pixels is None or m.min_pixels <= m.max_pixels,
         f"model.min_pixels ({m.min_pixels}) must be <= model.max_pixels ({m.max_pixels}).")
    need(m.max_context_tokens is None or m.max_context_tokens > r.max_new_tokens,
         f"model.max_context_tokens ({m.max_context_tokens}) must exceed rollout.max_new_tokens ({r.max_new_tokens}): "
         "a turn needs room for its prompt and its reply.")
    need(cfg.hub.every >= 1, f"hub.every must be >= 1, got {cfg.hub.every}.")
    need(not cfg.hub.repo_id or cfg.hub.repo_id.count("/") == 1,
         f"hub.repo_id must look like OWNER/NAME, got {cfg.hub.repo_id!r}.")
    if cfg.recipe == "grpo" and u.kl_coef > 0 and u.kl_in != "loss":
        raise ConfigError("recipe grpo puts the KL in the loss: set update.kl_in=loss (or update.kl_coef=0).")
    if cfg.recipe == "sft":
        need(cfg.sft.steps > 0, "recipe sft needs sft.steps > 0.")
    need(cfg.sft.batch_size >= 1, f"sft.batch_size must be >= 1, got {cfg.sft.batch_size}.")
    need(0 <= cfg.sft.random_action_frac <= 1, "sft.random_action_frac must be in [0, 1].")
    need(cfg.sft.answer_weight > 0, f"sft.answer_weight must be > 0 (1 = plain token mean), got {cfg.sft.answer_weight}.")
    need(cfg.log.keep_last >= 1, f"log.keep_last must be >= 1, got {cfg.log.keep_last}.")
    return cfg


# ----------------------------------------------------------------------------------------------
# loading, overrides, saving
# ----------------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b.0.c=value"`` -> (["a", "b", "0", "c"], yaml-parsed value)."""
    import yaml

    if "=" not in text:
        raise ConfigError(f"override {text!r} is not key=value (e.g. ppo.estimator=turn_gae).")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key part.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({exc}).") from exc
    return key.split("."), value


def _set_path(tree: dict, path: list[str], value: Any, cls: type | None) -> None:
    """Set ``value`` at ``path`` in a plain-dict config ``tree`` (cls guides unknown-key errors)."""
    node: Any = tree
    where = []
    for i, part in enumerate(path):
        last = i == len(path) - 1
        where.append(part)
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"override '{'.'.join(path)}': '{part}' must be an index below {len(node)}.")
            idx = int(part)
            if last:
                node[idx] = value
                return
            node = node[idx]
            cls = _list_item_class(cls)
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"override '{'.'.join(path)}': '{'.'.join(where[:-1])}' is not a section.")
        if cls is not None and dataclasses.is_dataclass(cls):
            names = [f.name for f in dataclasses.fields(cls)]
            if part not in names:
                raise ConfigError(
                    f"override '{'.'.join(path)}': unknown key '{part}' in {cls.__name__}."
                    f"{_suggest(part, names)} Valid keys: {', '.join(names)}."
                )
        if last:
            node[part] = value
            return
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        cls = _field_class(cls, part)


def _field_class(cls: type | None, name: str) -> type | None:
    import typing

    from vagent.config import field_types

    if cls is None or not dataclasses.is_dataclass(cls):
        return None
    tp = field_types(cls).get(name)
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (list, tuple):
        return tp  # resolved to the item class when indexed
    return None


def _list_item_class(tp: Any) -> type | None:
    import typing

    args = typing.get_args(tp) if tp is not None else ()
    return args[0] if args and dataclasses.is_dataclass(args[0]) else None


def default_run_name(cfg: RunConfig) -> str:
    """``<env names>-<recipe>``: the name of a run whose config sets none (``corridor-ppo``)."""
    envs = "-".join(dict.fromkeys(str(e.name).replace("/", "_").replace("\\", "_") for e in cfg.envs)) or "run"
    return f"{envs}-{cfg.recipe}"


def load_config(
    source: str | Path | Mapping[str, Any] | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> RunConfig:
    """Build a :class:`RunConfig` from a YAML file (or mapping, or the default preset) plus overrides."""
    import yaml

    from vagent.recipes.config.ranges import read_config_text

    if source is None:
        tree = default_preset_dict()
    elif isinstance(source, Mapping):
        tree = copy.deepcopy(dict(source))
    else:
        path = Path(source)
        if not path.is_file():
            presets = training_presets()
            raise ConfigError(
                f"config file {str(path)!r} does not exist. Pass a YAML file, e.g. "
                f"--config configs/frozenlake_ppo.yaml (presets: {', '.join(presets) or 'none found'})."
            )
        try:
            tree = yaml.safe_load(read_config_text(path)) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc}).") from exc
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys at the top level.")
    for text in overrides:
        keys, value = parse_override(text)
        _set_path(tree, keys, value, RunConfig)
    cfg = from_mapping(RunConfig, tree, where="config")
    cfg.name = cfg.name or default_run_name(cfg)
    cfg = validate(cfg)
    if cfg.imports:  # the modules that register the config's own envs, before anything looks them up
        from vagent.plugins import PluginImportError, import_modules

        try:
            import_modules(cfg.imports)
        except PluginImportError as exc:
            raise ConfigError(f"imports: {exc}") from exc
    return validate_envs(cfg)


#: env fields of the caption-pretraining boards (then ``image_size`` = ``model.tiny_image_size``,
#: then ``model.tiny_pretrain_env_config``); fields an env does not declare are left out
PRETRAIN_ENV_DEFAULTS = {"format": "grounding_worldmodeling", "render": "vision", "description_style": "symbolic"}


def pretrain_env_entries(m: ModelConfig, envs: Sequence[EnvEntry]) -> list[EnvEntry]:
    """The envs a tiny model is caption-pretrained on: each env name of the run once, in order,
    with the model's own env settings (:data:`PRETRAIN_ENV_DEFAULTS`, ``image_size`` =
    ``tiny_image_size``, then ``tiny_pretrain_env_config``), not the run's env config: the
    captions, and so the model, stay the same when the run changes how its envs render."""
    from vagent.config import field_types
    from vagent.envs.registry import env_class

    out = []
    for name in dict.fromkeys(e.name for e in envs):
        declared = field_types(env_class(name).Config)
        config = {k: v for k, v in {**PRETRAIN_ENV_DEFAULTS, "image_size": m.tiny_image_size}.items() if k in declared}
        out.append(EnvEntry(name=name, config={**config, **m.tiny_pretrain_env_config}))
    return out


def validate_envs(cfg: RunConfig) -> RunConfig:
    """Check every ``envs.N`` entry against its env's declared Config (names, keys, types, limits),
    so that a typo fails here, before a model is built; raise ConfigError naming the entry. An
    entry served by ``vagent serve-env`` (``urls``) whose env is not registered in this process is
    left to its server to check."""
    from vagent.envs.registry import list_envs, make_config

    for i, e in enumerate(cfg.envs):
        if e.urls and e.name not in list_envs():
            continue
        try:
            make_config(e.name, **e.config)
        except KeyError as exc:  # unknown env name: the message lists the registered ones
            raise ConfigError(f"envs.{i}.name: {str(exc).strip(chr(34) + chr(39))}") from exc
        except (ConfigError, ValueError, TypeError) as exc:
            raise ConfigError(f"envs.{i}.config: {exc}") from exc
    m = cfg.model
    if m.path == "tiny" and m.tiny_pretrain_steps > 0:  # the caption boards' envs, before the build
        for e in pretrain_env_entries(m, [e for e in cfg.envs if not e.urls or e.name in list_envs()]):
            try:
                make_config(e.name, **e.config)
            except (ConfigError, ValueError, TypeError) as exc:
                raise ConfigError(f"model.tiny_pretrain_env_config ({e.name} caption boards): {exc}") from exc
    return cfg


def describe_rows(cls: type | None = None, prefix: str = "") -> list[tuple[str, str, Any, str, bool]]:
    """(dotted key, type, default, doc, is_section) of every field of the run config, sections
    flattened (``envs`` items as ``envs.N.*``)."""
    from vagent.config import describe

    cls = cls or RunConfig
    rows = []
    for name, tp, default, doc in describe(cls):
        sub = _field_class(cls, name)
        if name == "envs":
            rows.append((f"{prefix}envs", "list of EnvEntry", None, doc, True))
            rows += describe_rows(EnvEntry, prefix + "envs.N.")
        elif sub is not None and dataclasses.is_dataclass(sub):
            rows.append((f"{prefix}{name}", sub.__name__, None, doc, True))
            rows += describe_rows(sub, prefix + name + ".")
        else:
            rows.append((f"{prefix}{name}", tp, default, doc, False))
    return rows


def default_run_value(key: str) -> Any:
    """The value of dotted ``key`` (as :func:`describe_rows` writes it; ``envs.N.*`` is the first
    entry) in the default run (``vagent train`` with no arguments)."""
    node: Any = _default_run_tree()
    for part in key.split("."):
        node = node[0] if part == "N" else node[part]
    return node


def _default_run_tree() -> dict:
    global _DEFAULT_RUN_TREE
    if _DEFAULT_RUN_TREE is None:
        _DEFAULT_RUN_TREE = to_dict(load_config(None))
    return _DEFAULT_RUN_TREE


_DEFAULT_RUN_TREE: dict | None = None


def _value_cells(key: str, default: Any) -> tuple[Any, Any | None]:
    """(the default run's value, the dataclass default where it differs, else None)."""
    used, plain = default_run_value(key), to_dict(default)
    return used, (None if used == plain else plain)


def describe_all() -> str:
    """Every config field with type, the default run's value (and the class default where it
    differs) and doc (``vagent train --describe``)."""
    lines = []
    for k, tp, default, doc, section in describe_rows():
        if section:
            lines.append(f"{k}:  # {doc}")
            continue
        used, plain = _value_cells(k, default)
        note = "" if plain is None else f" (class default {plain!r})"
        lines.append(f"{k} ({tp}) = {used!r}{note}  # {doc}")
    return "\n".join(lines)


def configuration_markdown() -> str:
    """The field tables of docs/configuration.md (tests/recipes/test_config.py keeps it current):
    the default run's value of each field, and the class default where it differs."""
    out: list[str] = []
    header = ["| key | type | default run | meaning |", "|---|---|---|---|"]
    out += ["### top level", ""] + header
    for k, tp, default, doc, section in describe_rows():
        if section:
            out += ["", f"### `{k}` ({tp})", "", doc[0].upper() + doc[1:] + ".", ""] + header
        else:
            used, plain = _value_cells(k, default)
            note = "" if plain is None else f" (class default `{plain!r}`)"
            out.append(f"| `{k}` | {tp} | `{used!r}`{note} | {doc.replace('|', '/')} |")
    return "\n".join(out) + "\n"


def config_to_yaml(cfg: RunConfig) -> str:
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None, width=100)


def preset_dir() -> Path:
    """The repository's configs/ folder (present in a source checkout)."""
    return Path(__file__).resolve().parents[3] / "configs"


def training_presets() -> list[str]:
    """Names of the run configs in :func:`preset_dir` (files whose top-level keys are all RunConfig
    fields: configs/eval_example.yaml, a ``vagent eval`` config, is not one)."""
    import yaml

    fields = {f.name for f in dataclasses.fields(RunConfig)}
    out = []
    for path in sorted(preset_dir().glob("*.yaml")) if preset_dir().is_dir() else []:
        try:
            tree = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(tree, dict) and tree and set(tree) <= fields:
            out.append(path.stem)
    return out


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
  micro_batch_tokens: 1024
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
    import yaml

    return yaml.safe_load(DEFAULT_PRESET_YAML)
