"""Small functions the recipes share: seeds, devices, optimizers, forward passes, validation.

Nothing here is a trainer: each function does one thing and the recipes (ppo.py, grpo.py,
sft.py) call them in the order the algorithm runs.

Token alignment (used everywhere): a causal LM's logits at position ``t - 1`` predict token
``t``, so ``logprobs[:, t] = log pi(input_ids[:, t] | input_ids[:, :t])`` is read from
``logits[:, t - 1]`` and ``logprobs[:, 0] = 0``. The critic is shifted the same way:
``values[:, t]`` is the critic's output at ``t - 1``, the value of the state BEFORE token ``t`` is
sampled; the bootstrap value of a truncated row is the critic's output at ``bootstrap_index``
(the last token of the appended final observation), i.e. the value before the next reply.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from vagent.recipes.config import EnvEntry, ModelConfig, RunConfig
from vagent.runs.errors import ModelError

# ----------------------------------------------------------------------------------------------
# seeds
# ----------------------------------------------------------------------------------------------


def derive_seed(*parts: Any) -> int:
    """A 62-bit seed from any parts (sha256 of their repr): same parts, same seed, any process."""
    blob = "|".join(repr(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 2


def train_env_specs(cfg: RunConfig, step: int) -> list:
    """The envs of RL step ``step``: for each entry, ``n_train`` consecutive seeds of the ``train``
    split at an offset derived from (run seed, entry index, step), so a resumed run replays the same
    envs and steps never share a seed by construction within 1e6 / n_train steps."""
    from vagent.rollout.loop import EnvSpec
    from vagent.seeds import SPLITS, split_seeds

    specs = []
    size = len(SPLITS["train"])
    for i, e in enumerate(cfg.envs):
        start = (derive_seed(cfg.seed, i) % size + step * e.n_train) % (size - e.n_train)
        specs += [EnvSpec(e.name, dict(e.config), s) for s in split_seeds("train", e.n_train, start)]
    return specs


def val_env_specs(entry: EnvEntry) -> list:
    """The first ``n_val`` seeds of the ``val`` split (the same for every validation)."""
    from vagent.rollout.loop import EnvSpec
    from vagent.seeds import split_seeds

    return [EnvSpec(entry.name, dict(entry.config), s) for s in split_seeds("val", entry.n_val)]


def stop_strings(cfg: RunConfig) -> tuple[str, ...]:
    """``rollout.stop`` plus the strings the run's envs declare as ending a reply
    (an env class's optional ``reply_stop``, e.g. vigorl_zoom's ``"</tool_call>"``), in order."""
    from vagent.envs.registry import env_class

    out = list(cfg.rollout.stop)
    for e in cfg.envs:
        out += [s for s in getattr(env_class(e.name), "reply_stop", ()) if s not in out]
    return tuple(out)


def sampling_for(cfg: RunConfig, step: int, greedy: bool = False):
    """The rollout's SamplingConfig at ``step`` (seed derived from the run seed and the step)."""
    from vagent.rollout.policy import SamplingConfig

    r = cfg.rollout
    return SamplingConfig(
        temperature=0.0 if greedy else r.temperature, top_p=r.top_p, top_k=r.top_k,
        max_new_tokens=r.max_new_tokens, stop=stop_strings(cfg), seed=derive_seed(cfg.seed, "sample", step),
    )


# ----------------------------------------------------------------------------------------------
# devices and precision
# ----------------------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device={name!r} but CUDA is not available here; use device=cpu or device=auto.")
    return dev


def use_bf16(setting: str, device: torch.device) -> bool:
    """bf16 autocast: ``auto`` turns it on for CUDA devices that support bf16 (off on CPU, where
    bf16 matmuls are usually slower than float32)."""
    if setting == "true":
        return True
    if setting == "false":
        return False
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def autocast(device: torch.device, enabled: bool):
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


# ----------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------


def tiny_model_dir(m: ModelConfig, envs: Sequence[EnvEntry] = ()) -> Path:
    """Where ``model.path: tiny`` lives: keyed by the sizes, the tokenizer corpus and (when caption
    pretrained) the pretraining settings and the envs it saw."""
    from vagent.models.tiny import tokenizer_corpus

    corpus = hashlib.sha256("\n".join(tokenizer_corpus()).encode()).hexdigest()[:8]
    name = f"tiny-{m.tiny_family}-h{m.tiny_hidden}-l{m.tiny_layers}-i{m.tiny_image_size}-s{m.tiny_seed}-{corpus}"
    if m.tiny_rope_theta:
        name += f"-rope{m.tiny_rope_theta:g}"
    if m.tiny_pretrain_steps > 0:
        # the captions depend on what the envs show, not on how they reward (reward_* keys)
        key = (repr([(e.name, sorted((k, v) for k, v in e.config.items() if not k.startswith("reward")))
                     for e in envs])
               + f"{m.tiny_pretrain_lr}/{m.tiny_pretrain_batch}/{sorted(m.tiny_pretrain_relations)}"
               + (f"/{m.tiny_pretrain_relation_steps}" if m.tiny_pretrain_relation_steps else ""))
        name += f"-cap{m.tiny_pretrain_steps}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    return Path(m.cache_dir).expanduser() / name


# the relation stage's caption boards start here, after the grid stage's (2048 by default)
_RELATION_BOARDS_FROM = 10_000


def prepare_model(m: ModelConfig, envs: Sequence[EnvEntry] = (),
                  say: Callable[[str], None] = print) -> Path:
    """The model directory to load: ``path``, or the tiny model (built, and caption-pretrained when
    ``tiny_pretrain_steps > 0``, once; then reused from ``cache_dir``)."""
    if m.path != "tiny":
        return Path(m.path).expanduser()
    from vagent.models.tiny import build_tiny_vlm

    out = tiny_model_dir(m, envs)
    if (out / "config.json").is_file():
        return out
    say(f"building tiny model {out.name} (first run only) ...")
    tmp = out.with_name(out.name + f".tmp-{derive_seed(str(out), id(m)) % 10**6}")
    if tmp.exists():
        shutil.rmtree(tmp)
    build_tiny_vlm(tmp, family=m.tiny_family, hidden=m.tiny_hidden, layers=m.tiny_layers,
                   image_size=m.tiny_image_size, seed=m.tiny_seed, rope_theta=m.tiny_rope_theta or None)
    if m.tiny_pretrain_steps > 0:
        from vagent.recipes.pretrain import pretrain_captions

        two_stage = m.tiny_pretrain_relation_steps > 0 and bool(m.tiny_pretrain_relations)
        say(f"caption-pretraining it for {m.tiny_pretrain_steps} steps (image -> board description) ...")
        pretrain_captions(tmp, envs, m.tiny_pretrain_steps, batch_size=m.tiny_pretrain_batch,
                          lr=m.tiny_pretrain_lr, seed=m.tiny_seed,
                          relations=() if two_stage else tuple(m.tiny_pretrain_relations), say=say)
        if two_stage:
            say(f"then {m.tiny_pretrain_relation_steps} steps on captions that add where the "
                f"{', '.join(m.tiny_pretrain_relations)} is (on fresh boards) ...")
            pretrain_captions(tmp, envs, m.tiny_pretrain_relation_steps, batch_size=m.tiny_pretrain_batch,
                              lr=m.tiny_pretrain_lr, seed=m.tiny_seed + 1, relations=tuple(m.tiny_pretrain_relations),
                              n_per_env=m.tiny_pretrain_relation_steps * m.tiny_pretrain_batch, stage="relations",
                              first_board=_RELATION_BOARDS_FROM, say=say)
    try:
        tmp.rename(out)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_model(cfg: RunConfig, path: Path, device: torch.device):
    """``load_policy`` with the run's dtype / LoRA / checkpointing; errors name the fix."""
    from vagent.models.loading import LoraSettings, load_policy

    lora = None
    if cfg.model.lora_rank > 0:
        lora = LoraSettings(r=cfg.model.lora_rank, alpha=int(cfg.model.lora_alpha), dropout=cfg.model.lora_dropout)
    try:
        loaded = load_policy(path, dtype=cfg.model.dtype, device=device, lora=lora,
                             gradient_checkpointing=cfg.model.gradient_checkpointing)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise ModelError(f"model.path: {exc}") from exc
    if cfg.model.freeze_vision:
        frozen = [p for n, p in loaded.model.named_parameters() if set(n.split(".")) & set(VISION_TOWER_NAMES)]
        if loaded.is_vision and not frozen:
            raise ModelError(f"model.freeze_vision: found no vision tower parameters in {path} "
                             f"(looked for modules named {VISION_TOWER_NAMES}).")
        for p in frozen:
            p.requires_grad_(False)
    return loaded


#: module names of vision towers in HF VLMs (Qwen2/2.5/3-VL: "visual")
VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model", "vision_encoder")


def check_compatible(loaded: Any, cfg: RunConfig) -> None:
    """A text-only model cannot play an env that shows images: say so before training."""
    if loaded.is_vision:
        return
    from vagent.envs import make

    for i, e in enumerate(cfg.envs):
        env = make(e.name, **e.config)
        try:
            obs, _ = env.reset(0)
        finally:
            env.close()
        if obs.images:
            raise ModelError(
                f"model {loaded.name} is text-only (no image processor / vision config) but env "
                f"'{e.name}' (envs.{i}) shows images. Use a vision-language model, or a text render: "
                f"envs.{i}.config.render=text."
            )


def export_policy(model: torch.nn.Module, source_dir: Path, out: Path) -> None:
    """Save the policy as a model directory that ``load_policy`` (and ``vagent eval``) can read:
    ``save_pretrained`` weights/config plus the tokenizer, chat template and image processor files
    of the source directory. A LoRA policy is saved merged into a copy of the base weights."""
    from vagent.models.forward import unwrap

    out.mkdir(parents=True, exist_ok=True)
    if getattr(model, "merge_and_unload", None) is not None:
        import copy

        copy.deepcopy(model).merge_and_unload().save_pretrained(out)
    else:
        unwrap(model).save_pretrained(out)
    for f in Path(source_dir).iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin")) and f.name not in ("config.json",
                                                                                             "generation_config.json"):
            if not (out / f.name).exists():
                shutil.copy2(f, out / f.name)


# ----------------------------------------------------------------------------------------------
# optimizers and schedules
# ----------------------------------------------------------------------------------------------


def make_optimizer(params: Sequence[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters (is everything frozen?)")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-8)


def lr_factor(step: int, warmup: int, total: int, kind: str) -> float:
    """Multiplier of the base lr at scheduler step ``step`` (0-based).

    Linear warm-up from 1/(warmup+1) to 1 over ``warmup`` steps, then constant, linear decay to 0
    at ``total`` or cosine decay to 0 at ``total``.
    """
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if kind == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return 1.0 - progress
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr_schedule must be constant, linear or cosine, got {kind!r}")


def make_scheduler(opt: torch.optim.Optimizer, warmup: int, total: int, kind: str):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, total, kind))


def clip_grads(params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
    """Clip to ``max_norm`` (0 = measure only); returns the norm before clipping."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    return float(norm)


# ----------------------------------------------------------------------------------------------
# forward passes on a TokenBatch
# ----------------------------------------------------------------------------------------------


def shift_right(x: Tensor) -> Tensor:
    """out[:, t] = x[:, t - 1], out[:, 0] = 0 (see the module docstring)."""
    out = torch.zeros_like(x)
    out[:, 1:] = x[:, :-1]
    return out


def rl_temperature(cfg: Any) -> float:
    """The temperature RL scores log-probs at: the training rollouts' (1.0 when they are greedy)."""
    t = float(cfg.rollout.temperature)
    return t if t > 0 else 1.0


def policy_forward(model: torch.nn.Module, mb: Any, chunk: int, with_entropy: bool = False,
                   temperature: float = 1.0, hidden: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """(logprobs [B, L], entropy [B, L] or None) of a micro-batch, aligned with its tokens.

    ``logprobs[:, t]`` is log pi of token t (from logits at t - 1); ``entropy[:, t]`` the entropy
    of the distribution token t was drawn from. Only positions of ``mb.loss_mask`` are computed
    (every caller masks with it); the others, and position 0, hold 0. ``temperature`` divides the
    logits first, so that RL's pi is the distribution the rollout sampled from (as verl does).

    The LM head runs only on the hidden states that predict a loss token (see
    :func:`head_only_logits`): with observations and prompts that make up most of every row, this
    skips most of the [B, L, V] logits and their log-softmax, forward and backward. ``hidden``
    [B, L, H]: the backbone's last hidden states of ``mb`` when the caller already has them.
    """
    from vagent.models.forward import forward_logits
    from vagent.rl.losses import entropy_from_logits, logprobs_from_logits

    B, L = mb.input_ids.shape
    want = mb.loss_mask[:, 1:].bool()  # logits at t - 1 predict token t
    logits = head_only_logits(model, mb, want, hidden)
    if logits is None:  # a model whose logits are not lm_head(hidden): the full forward
        logits = forward_logits(model, mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw)
        logits = logits[:, :-1][want]
    if temperature != 1.0:
        logits = logits / temperature
    labels = mb.input_ids[:, 1:][want]
    zeros = torch.zeros((B, L - 1), dtype=torch.float32, device=logits.device)
    pad = torch.zeros((B, 1), dtype=torch.float32, device=logits.device)
    lp = torch.cat([pad, zeros.masked_scatter(want, logprobs_from_logits(logits, labels, chunk))], 1)
    ent = None
    if with_entropy:
        ent = torch.cat([pad, zeros.masked_scatter(want, entropy_from_logits(logits, chunk))], 1)
    return lp, ent


@dataclass
class SharedPrefix:
    """The key/value states of the first ``length`` tokens that every row of a batch shares (the
    system prompt of SFT chats), computed once without a graph: see :func:`shared_prefix`."""

    length: int
    kv: list  # per layer (keys [1, heads, length, d], values [1, heads, length, d])


def common_prefix_length(batch: Any, image_token_id: int | None) -> int:
    """Tokens at the start of every row of ``batch`` that are identical, real (attention 1), not
    an image placeholder and not needed to predict a loss token: the part whose states
    :func:`shared_prefix` may compute once. 0 when the rows differ at once."""
    ids, real = batch.input_ids, batch.attention_mask.bool()
    same = (ids == ids[:1]).all(0) & real.all(0)
    stops = [int(same.long().cumprod(0).sum())]
    loss_cols = batch.loss_mask.any(0).nonzero()
    if len(loss_cols):  # the token before the first loss token must be in the suffix
        stops.append(int(loss_cols[0]) - 1)
    if image_token_id is not None:
        images = (ids[0] == image_token_id).nonzero()
        if len(images):
            stops.append(int(images[0]))
    return max(0, min(stops))


@torch.no_grad()
def shared_prefix(model: torch.nn.Module, batch: Any, min_length: int = 32) -> SharedPrefix | None:
    """The backbone's key/value states of the tokens all rows of ``batch`` share, from ONE forward of
    one row, or None when fewer than ``min_length`` tokens are shared or the backbone returns no cache.

    Used by SFT (``sft.shared_prefix``): every chat starts with the same system prompt (~40% of the
    default run's SFT tokens), so :func:`hidden_after_prefix` runs only each row's suffix. The
    forward values are the full forward's; the gradient does not flow into the prefix's states
    (a stop-gradient on the shared context), which is the departure from the exact SFT gradient.
    """
    from vagent.models.forward import backbone_of, explicit_position_ids, model_inputs, mrope_image_token_id

    n = common_prefix_length(batch, mrope_image_token_id(model))
    if n < min_length:
        return None
    ids, mask = batch.input_ids[:1, :n], batch.attention_mask[:1, :n]
    positions = explicit_position_ids(model, ids, mask)
    out = backbone_of(model)(**model_inputs(model, ids, mask, position_ids=positions), use_cache=True)
    cache = getattr(out, "past_key_values", None)
    if cache is None or not hasattr(cache, "layers"):
        return None
    return SharedPrefix(n, [(layer.keys, layer.values) for layer in cache.layers])


def hidden_after_prefix(model: torch.nn.Module, mb: Any, prefix: SharedPrefix) -> Tensor:
    """Last hidden states [B, L, H] of micro-batch ``mb`` whose first ``prefix.length`` tokens are
    the shared prefix: the backbone runs on the rest only, attending to the cached prefix states;
    prefix positions hold zeros (no loss token is predicted from them, see
    :func:`common_prefix_length`)."""
    from transformers import DynamicCache

    from vagent.models.forward import backbone_of, explicit_position_ids, model_inputs

    n, B = prefix.length, mb.input_ids.shape[0]
    positions = explicit_position_ids(model, mb.input_ids, mb.attention_mask, mb.image_grid_thw)
    cache = DynamicCache(ddp_cache_data=[(k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1)) for k, v in prefix.kv])
    kwargs = model_inputs(model, mb.input_ids[:, n:], mb.attention_mask, mb.pixel_values, mb.image_grid_thw,
                          position_ids=positions[..., n:])
    suffix = backbone_of(model)(**kwargs, past_key_values=cache, use_cache=True).last_hidden_state
    return torch.cat([suffix.new_zeros((B, n, suffix.shape[-1])), suffix], 1)


#: config fields of models whose forward transforms ``lm_head(hidden)`` (soft-capping, scaling)
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def head_only_logits(model: torch.nn.Module, mb: Any, want: Tensor, hidden: Tensor | None = None) -> Tensor | None:
    """Logits [N, V] of the positions ``want`` [B, L - 1] (row-major order): the backbone's last
    hidden states there (``hidden``, or a backbone forward) through the output embeddings, or None
    when the model's logits are not plainly ``lm_head(hidden)`` (then the caller runs the full
    forward)."""
    from vagent.models.forward import forward_hidden, unwrap

    base = unwrap(model)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    configs = [base.config, getattr(base.config, "text_config", None)]
    if head is None or any(getattr(c, k, None) not in (None, 1.0) for c in configs if c is not None
                           for k in _LOGIT_TRANSFORMS):
        return None
    if hidden is None:
        hidden = forward_hidden(model, mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw)
    return head(hidden[:, :-1][want])


def score_logprobs(model: torch.nn.Module, ref: Any, batch: Any, max_tokens: int, chunk: int,
                   temperature: float) -> tuple[Tensor, Tensor | None]:
    """The scoring passes shared by PPO and GRPO (no grad): (log pi_old, log pi_ref or None) [B, L]
    at the rollout temperature; ``ref`` is a reference model handle or None (no KL)."""
    model.eval()
    old = per_row(batch, max_tokens, lambda mb: policy_forward(model, mb, chunk, temperature=temperature)[0])
    return old, score_reference(ref, batch, max_tokens, chunk, temperature)


def score_reference(ref: Any, batch: Any, max_tokens: int, chunk: int, temperature: float) -> Tensor | None:
    """log pi_ref [B, L] at the rollout temperature (no grad), or None when there is no reference."""
    if ref is None:
        return None
    with ref.active() as ref_model:
        return per_row(batch, max_tokens, lambda mb: policy_forward(ref_model, mb, chunk, temperature=temperature)[0])


@torch.no_grad()
def score_shared(model: torch.nn.Module, critic: Any, batch: Any, max_tokens: int, chunk: int,
                 temperature: float, max_feature_bytes: int = 2**31) -> tuple[Tensor, Tensor, Tensor | None]:
    """The scoring pass of a critic that shares the policy's backbone: ONE backbone forward per
    micro-batch gives (log pi_old [B, L], raw critic outputs [B, L], features [B, L, H] or None).

    The same numbers as :func:`score_logprobs` (old) and ``per_row(critic_forward)``, for one
    backbone pass instead of two. The features let :func:`critic_update` train the head without
    running the backbone again (the backbone does not change before the actor update, which comes
    after the critic's). They are float32, B * L * H values: 10 MB for a batch of the default run, but 17 GB
    for 256 rows of 8k tokens of a 2048-wide model, so above ``max_feature_bytes`` they are not
    kept (None) and the critic update runs the backbone (without a graph) instead.
    """
    from vagent.models.forward import forward_hidden

    model.eval()
    B, L = batch.input_ids.shape
    keep = B * L * critic.value_head.in_features * 4 <= max_feature_bytes

    def one_pass(mb):
        hidden = forward_hidden(model, mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw)
        lp, _ = policy_forward(model, mb, chunk, temperature=temperature, hidden=hidden)
        return (lp, critic.values_from_hidden(hidden)) + ((hidden,) if keep else ())

    out = per_row(batch, max_tokens, one_pass)
    return out[0], out[1], out[2] if keep else None


def critic_forward(critic: torch.nn.Module, mb: Any) -> Tensor:
    """Raw critic outputs [B, L] float32 (``out[:, t]``: value of the prefix ending at t)."""
    return critic(mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw)


def micro_batch_rows(batch: Any, max_tokens: int) -> list[list[int]]:
    """Row groups of ``batch`` with rows x longest row <= ``max_tokens`` (a longer row alone).

    Rows are taken longest first so that rows of similar length share a micro-batch and little
    compute goes to padding; accumulation makes the order irrelevant to the gradient.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    lengths = batch.lengths.tolist()
    for r in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[r]
        if current and (len(current) + 1) * max(longest, n) > max_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(r)
        longest = max(longest, n)
    if current:
        groups.append(current)
    return groups


@torch.no_grad()
def per_row(batch: Any, max_tokens: int, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn(micro_batch)`` over micro-batches and reassemble, zero-padded and float32: a
    [b, l, ...] result becomes [B, L, ...]; a tuple of them, a tuple of reassembled tensors."""
    outs: list[Tensor] | None = None
    single = False
    for rows in micro_batch_rows(batch, max_tokens):
        vals = fn(batch.select(rows))
        single = isinstance(vals, Tensor)
        vals = (vals,) if single else tuple(vals)
        if outs is None:
            outs = [torch.zeros((*batch.input_ids.shape, *v.shape[2:]), dtype=torch.float32,
                                device=batch.input_ids.device) for v in vals]
        idx = torch.as_tensor(rows, device=outs[0].device)
        for out, v in zip(outs, vals):
            out[idx, : v.shape[1]] = v.float()
    return outs[0] if single else tuple(outs)


def accumulation_weight(mb_mask: Tensor, total_mask: Tensor, agg: str) -> float:
    """Weight of a micro-batch's aggregated loss so that the weighted sum over micro-batches equals
    the loss aggregated over the whole mini-batch: token-mean -> its share of loss tokens;
    sequence means -> its share of non-empty rows."""
    if agg == "token-mean":
        return float(mb_mask.sum()) / max(1.0, float(total_mask.sum()))
    return float((mb_mask.sum(-1) > 0).sum()) / max(1.0, float((total_mask.sum(-1) > 0).sum()))


def mini_batches(n_rows: int, n_mini: int, seed: int) -> list[list[int]]:
    """A shuffled split of ``range(n_rows)`` into ``n_mini`` near-equal parts (seeded generator)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_rows, generator=g).tolist()
    n_mini = max(1, min(n_mini, n_rows))
    return [sorted(perm[i::n_mini]) for i in range(n_mini)]


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------


def validate(policy: Any, cfg: RunConfig) -> dict[str, float]:
    """Greedy episodes on the ``val`` split of every env entry.

    Metrics per env ``val/<env>/{success_rate, return, turns, format_accuracy}`` and over all
    val episodes ``val/{success_rate, return, turns, format_accuracy, time_s}``.
    """
    import time

    from vagent.rollout.loop import rollout

    t0 = time.perf_counter()
    greedy = sampling_for(cfg, 0, greedy=True)
    max_turns = cfg.val.max_turns or cfg.rollout.max_turns
    out: dict[str, float] = {}
    all_eps = []
    names = [e.name for e in cfg.envs]
    for e in cfg.envs:
        if e.n_val <= 0:
            continue
        eps = rollout(val_env_specs(e), policy, greedy, group_size=1, max_turns=max_turns,
                      mode=cfg.rollout.mode, window=cfg.rollout.window)
        eps = [x for x in eps if x.error is None]
        all_eps += eps
        key = e.name if names.count(e.name) == 1 else f"{e.name}{names.index(e.name)}"
        out.update({f"val/{key}/{k}": v for k, v in episode_summary(eps).items()})
    if all_eps:
        out.update({f"val/{k}": v for k, v in episode_summary(all_eps).items()})
    out["val/time_s"] = time.perf_counter() - t0
    return out


def episode_summary(eps: Sequence[Any]) -> dict[str, float]:
    n = max(1, len(eps))
    turns = [t for e in eps for t in e.turns]
    return {
        "success_rate": sum(e.success for e in eps) / n,
        "return": sum(e.total_reward for e in eps) / n,
        "turns": sum(len(e.turns) for e in eps) / n,
        "format_accuracy": sum(t.parsed.format_ok for t in turns) / max(1, len(turns)),
    }


def reward_metrics(episodes: Sequence[Any]) -> dict[str, float]:
    """``reward/*``: episode reward statistics of the training rollout (errored episodes left out)."""
    eps = [e for e in episodes if e.error is None]
    if not eps:
        return {}
    scores = torch.tensor([e.total_reward for e in eps])
    turn_r = [t.reward for e in eps for t in e.turns]
    reasoning = [sum(t.reasoning_rewards.values()) for e in eps for t in e.turns]
    return {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std(unbiased=False)),
        "reward/max": float(scores.max()),
        "reward/min": float(scores.min()),
        "reward/turn_mean": sum(turn_r) / max(1, len(turn_r)),
        "reward/reasoning_mean": sum(reasoning) / max(1, len(reasoning)),
    }


@dataclass
class Session:
    """What the recipes share within one run (a record, not a trainer)."""

    cfg: RunConfig
    run: Any  # vagent.runs.RunDir
    console: Any  # vagent.runs.Console
    logger: Any  # vagent.runs.MetricsLogger
    device: torch.device
    bf16: bool
    loaded: Any  # vagent.models.LoadedModel (the policy)
    model_dir: Path
    #: the newest checkpoint written or resumed from (for error messages)
    last_checkpoint: str | None = None

    def reasoning_reward(self):
        """The configured reasoning reward (``vagent.rewards.ReasoningReward``) for ``rollout``, or None."""
        if not self.cfg.reasoning_reward:
            return None
        from vagent.rewards import ReasoningReward

        return ReasoningReward(self.cfg.reasoning_reward)


def train_rollout(session: Session, policy: Any, step: int, reasoning: Any) -> Any:
    """The training rollout of RL ``step`` (sampled, train-split seeds of the step). If generation
    fails because the policy's weights hold NaN/inf, say so (NonFiniteError) instead of a sampler
    error."""
    from vagent.rollout.loop import rollout
    from vagent.runs.errors import check_module_finite

    cfg = session.cfg
    try:
        return rollout(train_env_specs(cfg, step), policy, sampling_for(cfg, step),
                       group_size=cfg.rollout.group_size, max_turns=cfg.rollout.max_turns,
                       mode=cfg.rollout.mode, window=cfg.rollout.window, reasoning_reward=reasoning)
    except RuntimeError as exc:
        check_module_finite(session.loaded.model, "policy weights", "rl", step, session.last_checkpoint)
        if "inf" in str(exc).lower() or "nan" in str(exc).lower():
            from vagent.runs.errors import NonFiniteError

            raise NonFiniteError("the policy's next-token probabilities during the rollout (the weights are "
                                 "finite but the forward pass overflowed)", float("nan"), "rl", step,
                                 session.last_checkpoint) from exc
        raise
