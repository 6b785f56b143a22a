"""The run config's sections (one dataclass each) and :class:`RunConfig`, their tree; each field's
doc is the ``#:`` comment above it. Defaults follow VAGEN (docs/algorithms.md reference section 6)
for PPO (clip 0.2, entropy 0.001, gamma_token 1.0, gamma_turn 0.95, lam 1.0, grad clip 1.0, value
clip 0.5) and ViGoRL for GRPO (clip-higher 0.2/0.28, dual-clip 3, KL in loss k3); learning rates
are NOT the paper's (1e-6 / 1e-5 for a 3B model): the tiny CPU models need much larger ones, set
per preset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
    #: tiny model attention heads (head size = tiny_hidden / tiny_heads; key/value heads = half of them, at least 1).
    #: vLLM's CPU attention serves head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256 and 512 only: the
    #: default 128 / 4 = 32 works (path "tiny" only)
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
    #: env config fields of the caption-pretraining boards, over the model's own settings (render vision,
    #: image_size = tiny_image_size, description_style symbolic, format grounding_worldmodeling); the run's
    #: env config is not used, so changing how the run's envs render reuses the cached model
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
    #: the most tokens one sample may hold (context + rollout.max_new_tokens); a turn that would exceed it
    #: is not generated and ends the episode as truncated (finish reason context_limit); null = no limit
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
    #: seconds one request to a ``urls`` server may take: a server that stops answering (hung, its
    #: host cut off) is given up after 3 such tries, and its episodes replay on the next server
    timeout_s: float = 60.0
    #: seconds one env call may keep retrying across ``urls`` (servers restarting) before the run
    #: stops with an error naming them
    retry_timeout_s: float = 60.0
    #: added env step latency for benchmarks, fields of vagent.envs.latency.StepLatency (dist, median_s,
    #: sigma, alpha, max_s, salt), e.g. {dist: pareto, median_s: 0.05, alpha: 1.5}; training envs only
    #: (validation measures the policy, not the rollout's speed); null = none (docs/envs.md)
    latency: dict | None = None


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
    #: seconds a weight push to the engine replicas may take (also their start-up wait); a replica
    #: that has not loaded the weights by then is stuck: it is killed and the rest go on. 7B bf16 is
    #: 15 GB, ~120 s at 1 Gbit/s (~240 s for two replica hosts, or fp32), so 600 leaves over 2x
    push_timeout_s: float = 600.0
    #: seconds one engine replica may take to answer a generate call (also the canary's and stats'
    #: calls); a replica silent that long is stuck: it is killed and its requests go to the others.
    #: 1024 new tokens at ~2 decode steps/s (a 7B on a slow CPU) take ~9 min, ~17 min when the call
    #: waits behind a batch already running, so 1800 leaves a margin
    generate_timeout_s: float = 1800.0
    #: lockstep (one batched policy call per turn for the whole batch) or async (each trajectory
    #: advances as soon as its own reply and env step return; same episodes, per-request seeds)
    schedule: Literal["lockstep", "async"] = "lockstep"
    #: 1 = generate step k+1's batch with the previous weights while step k updates (staleness 1,
    #: PPO ratio against the sampling-time log-probs; needs replicas >= 1 or engine vllm); 0 = off
    overlap: int = 0
    #: streaming rollout (docs/distributed.md "Streaming"): K >= 1 keeps the rollouts of the next K
    #: steps generating on the replicas while the trainer updates; weights are pushed right after
    #: each update and in-flight trajectories continue on them, so a batch's tokens are 0..K updates
    #: old (decoupled PPO corrects it). Needs replicas >= 1 and overlap 0; 0 = off
    max_staleness: int = 0
    #: streaming with hf replicas: a weight push stops the replies being generated between two decode
    #: steps, and each continues from its tokens on the new weights (one reply spans versions; every
    #: token keeps its own log-prob and version). false = a push waits for the running replies
    interrupt: bool = False
    #: streaming: how a batch is formed. step = the rollout of step s (its env seeds), taken whole
    #: (waits for its slowest trajectory); completion = the first groups to finish among every
    #: rollout in flight (whole groups, in completion order; a job's ranks each take their share)
    batch_order: Literal["step", "completion"] = "step"
    #: batch_order completion: a group whose oldest token is more than max_staleness updates behind
    #: when its batch is taken is dropped and generated again (drop, counted in rollout/dropped) or
    #: trained with the decoupled loss's truncated behaviour weights (keep)
    too_stale: Literal["drop", "keep"] = "drop"
    #: a streaming run's directory (or its rollout_schedule.jsonl) whose recorded schedule (which
    #: weights version sampled each turn) this run follows: same config, same episodes and weights;
    #: null = free-running (the schedule is recorded in this run's directory)
    replay_schedule: str | None = None
    #: engine vllm: share of the GPU's memory (vLLM's CPU build: of the RAM) each vLLM engine may
    #: take for weights + KV cache; null = the platform's default (GPU 0.4, CPU 0.1)
    vllm_gpu_memory: float | None = None
    #: the generator's parameter dtype: auto (the trainer's), float32 or bfloat16 (engine replicas
    #: and vLLM; a bf16 engine beside an fp32 trainer is the mismatch rollout_correction corrects)
    engine_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    #: after every weight push to a generator apart from the trainer (replicas, vLLM), score a fixed
    #: probe (prompts with images from the train envs, saved as <run>/canary_probe.pt) with the
    #: engine and the trainer; a log-prob gap over canary_tolerance stops the run before the next
    #: rollout (docs/distributed.md "Weight-push canary")
    canary: bool = True
    #: the largest |log pi_engine - log pi_trainer| the canary accepts on a probe token; null = by
    #: dtype: 0.01 when engine and trainer are float32, 1.0 when either is bfloat16 / float16
    canary_tolerance: float | None = None
    #: Ray custom resources each engine replica requires, e.g. {vagent_replica: 1}: replicas start
    #: only on Ray nodes that offer them, which pins them to hosts (start those hosts with `ray start
    #: --address HEAD:6379 --resources '{"vagent_replica": 2}'`; docs/distributed.md "Pinning
    #: replicas to hosts"); empty = any node with free CPUs / GPUs
    replica_resources: dict[str, float] = field(default_factory=dict)


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
    #: run each micro-batch's rows as one packed sequence (no padding; positions restart per row,
    #: attention kept inside each row; varlen flash attention with flash_attn on a GPU) in the
    #: scoring passes and the actor / critic updates: the same numbers up to float rounding
    #: (docs/training.md, Packing). On in the default run (1.3x at 4096 tokens on a CPU); off here
    #: until a GPU measures per-row attention against padded batches
    packing: bool = False


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
    #: redraw plots/*.png every N steps (and at the end)
    plot_every: int = 5
    #: draw plots/*.png at all; false: none (a sweep's trials, tests): metrics.jsonl holds every curve
    plots: bool = True
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
class RolloutCorrectionConfig:
    """Engine/trainer mismatch correction on the policy loss (docs/algorithms.md "Rollout
    correction"; verl's rollout_corr). Off by default. With any of it on, the PPO ratio is taken
    against the trainer's log-probs before the update (with rollout.overlap 1: the proximal policy,
    AReaL's decoupled PPO) and these weights and rejections use the engine's sampling log-probs."""

    #: truncated importance sampling: none, token (each token's loss x min(rho_t, C)) or sequence
    #: (x min(prod_t rho_t, C)), rho = pi_trainer / pi_engine
    is_level: Literal["none", "token", "sequence"] = "none"
    #: C, the truncation of the IS weights (> 0; verl's default 2.0)
    is_threshold: float = 2.0
    #: rejection (masked IS): none, token, sequence (prod_t rho_t) or geometric (exp(mean_t log rho_t));
    #: tokens / rows whose ratio leaves [rs_low, rs_high] get no gradient
    rs_level: Literal["none", "token", "sequence", "geometric"] = "none"
    #: lower bound of the accepted ratio (null = 1 / rs_high)
    rs_low: float | None = None
    #: upper bound of the accepted ratio (> rs_low)
    rs_high: float = 2.0
    #: a row with any token of rho_t below this is rejected whole (null = off; e.g. 1e-4)
    veto_threshold: float | None = None


@dataclass
class DistConfig:
    """Runs of several processes (torchrun; docs/distributed.md); ignored by a single process."""

    #: seconds a collective waits for the other ranks before the job fails with the collective's name
    timeout_s: float = 600.0
    #: FSDP2 CPU offload: parameter shards, gradients and optimizer state in CPU memory (saves GPU memory, slower)
    cpu_offload: bool = False
    #: FSDP2 frees each layer's gathered weights after its forward and gathers them again for the backward (false: keep them, more memory, fewer all-gathers)
    reshard_after_forward: bool = True
    #: GPUs (processes) the config was written for, e.g. 4 for the paper's recipes (configs/paper/); 0 = any.
    #: When > 0, `vagent train` checks before any work that a hub model is already downloaded (else it prints the
    #: `hf download` command) and, with fewer processes, says how each GPU's share of the batch grows, or refuses
    #: where the training state cannot fit the GPUs (vagent.recipes.scale, docs/paper.md)
    nproc: int = 0


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
    #: engine/trainer mismatch correction (truncated IS, rejection, decoupled PPO); off by default
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
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
