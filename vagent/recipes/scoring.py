"""Forward passes on a TokenBatch: log-probs, entropies, critic values, and the scoring passes.

Token alignment (used everywhere): a causal LM's logits at position ``t - 1`` predict token
``t``, so ``logprobs[:, t] = log pi(input_ids[:, t] | input_ids[:, :t])`` is read from
``logits[:, t - 1]`` and ``logprobs[:, 0] = 0``. The critic is shifted the same way:
``values[:, t]`` is the critic's output at ``t - 1``, the value of the state BEFORE token ``t`` is
sampled; the bootstrap value of a truncated row is the critic's output at ``bootstrap_index``
(the last token of the appended final observation), i.e. the value before the next reply.

Sharded models (a job of several ranks): every forward here runs through the model's FSDP2 root
(:func:`vagent.distributed.on_root`), whose forward is the whole pass, so that the root's hooks
gather the embedding and head weights that the backbone and the head use directly. In a single
process ``on_root(model, fn, ...)`` is just ``fn(...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

import torch
from torch import Tensor

from transformers import DynamicCache

from vagent.distributed import RowResults, on_root, world
from vagent.models.forward import (
    backbone_of, explicit_position_ids, forward_hidden, forward_logits, model_inputs, mrope_image_token_id, unwrap,
)
from vagent.recipes.stages import PPOScores, Scores
from vagent.rl.losses import entropy_from_logits, logprobs_from_logits

if TYPE_CHECKING:
    from vagent.models.value import ReferenceModel, ValueModel
    from vagent.runconfig import RunConfig, UpdateConfig
    from vagent.rollout.batch import TokenBatch


def shift_right(x: Tensor) -> Tensor:
    """out[:, t] = x[:, t - 1], out[:, 0] = 0 (see the module docstring)."""
    out = torch.zeros_like(x)
    out[:, 1:] = x[:, :-1]
    return out


def rl_temperature(cfg: RunConfig) -> float:
    """The temperature RL scores log-probs at: the training rollouts' (1.0 when they are greedy)."""
    t = float(cfg.rollout.temperature)
    return t if t > 0 else 1.0


def policy_forward(model: torch.nn.Module, mb: TokenBatch, chunk: int, with_entropy: bool = False,
                   temperature: float = 1.0, hidden: Tensor | None = None,
                   packed: bool = False) -> tuple[Tensor, Tensor | None]:
    """See :func:`_policy_forward` (this runs it through the model's FSDP2 root when sharded)."""
    return on_root(model, _policy_forward, model, mb, chunk, with_entropy, temperature, hidden, packed)


def _policy_forward(model: torch.nn.Module, mb: TokenBatch, chunk: int, with_entropy: bool = False,
                    temperature: float = 1.0, hidden: Tensor | None = None,
                    packed: bool = False) -> tuple[Tensor, Tensor | None]:
    """(logprobs [B, L], entropy [B, L] or None) of a micro-batch, aligned with its tokens.

    ``logprobs[:, t]`` is log pi of token t (from logits at t - 1); ``entropy[:, t]`` the entropy
    of the distribution token t was drawn from. Only positions of ``mb.loss_mask`` are computed
    (every caller masks with it); the others, and position 0, hold 0. ``temperature`` divides the
    logits first, so that RL's pi is the distribution the rollout sampled from (as verl does).

    The LM head runs only on the hidden states that predict a loss token (see
    :func:`head_only_logits`): with observations and prompts that make up most of every row, this
    skips most of the [B, L, V] logits and their log-softmax, forward and backward. ``hidden``
    [B, L, H]: the backbone's last hidden states of ``mb`` when the caller already has them.
    ``packed``: the forward runs the rows as one sequence without padding (update.packing,
    :mod:`vagent.models.packing`); the same numbers up to float rounding.
    """
    B, L = mb.input_ids.shape
    want = mb.loss_mask[:, 1:].bool()  # logits at t - 1 predict token t
    logits = head_only_logits(model, mb, want, hidden, packed)
    if logits is None:  # a model whose logits are not lm_head(hidden): the full forward
        logits = forward_logits(model, mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw,
                                packed=packed)
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


def common_prefix_length(batch: TokenBatch, image_token_id: int | None) -> int:
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
def shared_prefix(model: torch.nn.Module, batch: TokenBatch, min_length: int = 32) -> SharedPrefix | None:
    """The backbone's key/value states of the tokens all rows of ``batch`` share, from ONE forward of
    one row, or None when fewer than ``min_length`` tokens are shared or the backbone returns no cache.

    Used by SFT (``sft.shared_prefix``): every chat starts with the same system prompt (~40% of the
    default run's SFT tokens), so :func:`hidden_after_prefix` runs only each row's suffix. The
    forward values are the full forward's; the gradient does not flow into the prefix's states
    (a stop-gradient on the shared context), which is the departure from the exact SFT gradient.
    """
    n = common_prefix_length(batch, mrope_image_token_id(model))
    if n < min_length:
        return None
    ids, mask = batch.input_ids[:1, :n], batch.attention_mask[:1, :n]
    positions = explicit_position_ids(model, ids, mask)
    out = on_root(model, backbone_of(model), **model_inputs(model, ids, mask, position_ids=positions), use_cache=True)
    cache = getattr(out, "past_key_values", None)
    if cache is None or not hasattr(cache, "layers"):
        return None
    return SharedPrefix(n, [(layer.keys, layer.values) for layer in cache.layers])


def hidden_after_prefix(model: torch.nn.Module, mb: TokenBatch, prefix: SharedPrefix) -> Tensor:
    """Last hidden states [B, L, H] of micro-batch ``mb`` whose first ``prefix.length`` tokens are
    the shared prefix: the backbone runs on the rest only, attending to the cached prefix states;
    prefix positions hold zeros (no loss token is predicted from them, see
    :func:`common_prefix_length`)."""
    n, B = prefix.length, mb.input_ids.shape[0]
    positions = explicit_position_ids(model, mb.input_ids, mb.attention_mask, mb.image_grid_thw)
    cache = DynamicCache(ddp_cache_data=[(k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1)) for k, v in prefix.kv])
    kwargs = model_inputs(model, mb.input_ids[:, n:], mb.attention_mask, mb.pixel_values, mb.image_grid_thw,
                          position_ids=positions[..., n:])
    suffix = on_root(model, backbone_of(model), **kwargs, past_key_values=cache, use_cache=True).last_hidden_state
    return torch.cat([suffix.new_zeros((B, n, suffix.shape[-1])), suffix], 1)


#: config fields of models whose forward transforms ``lm_head(hidden)`` (soft-capping, scaling)
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def head_only_logits(model: torch.nn.Module, mb: TokenBatch, want: Tensor,
                     hidden: Tensor | None = None, packed: bool = False) -> Tensor | None:
    """Logits [N, V] of the positions ``want`` [B, L - 1] (row-major order): the backbone's last
    hidden states there (``hidden``, or a backbone forward) through the output embeddings, or None
    when the model's logits are not plainly ``lm_head(hidden)`` (then the caller runs the full
    forward)."""
    base = unwrap(model)
    get_head = getattr(base, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    configs = [base.config, getattr(base.config, "text_config", None)]
    if head is None or any(getattr(c, k, None) not in (None, 1.0) for c in configs if c is not None
                           for k in _LOGIT_TRANSFORMS):
        return None
    if hidden is None:
        hidden = forward_hidden(model, mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw,
                                packed=packed)
    return head(hidden[:, :-1][want])


@dataclass(frozen=True)
class ScoringPass:
    """How the no-grad scoring passes run (``update.*`` and the rollout's temperature)."""

    max_tokens: int  # rows x padded length of a micro-batch (update.micro_batch_tokens)
    chunk: int  # positions log-softmaxed at once (update.logprob_chunk)
    temperature: float  # log-probs of logits / temperature: the rollout's sampling temperature
    packed: bool = False  # forwards without padding (update.packing)
    split: bool = False  # the rows are divided over the ranks of a job (vagent.distributed.RowResults)


def pass_logprobs(model: torch.nn.Module, how: ScoringPass, mb: TokenBatch) -> Tensor:
    """log pi [b, l] of micro-batch ``mb`` under ``model`` at the pass's temperature."""
    return policy_forward(model, mb, how.chunk, temperature=how.temperature, packed=how.packed)[0]


@torch.no_grad()
def score_logprobs(model: torch.nn.Module, ref: ReferenceModel | None, batch: TokenBatch,
                   how: ScoringPass) -> tuple[Tensor, Tensor | None]:
    """The scoring passes shared by PPO and GRPO (no grad): (log pi_old, log pi_ref or None) [B, L]
    at the rollout temperature; ``ref`` is a reference model handle or None (no KL)."""
    model.eval()
    rows = RowResults[Tensor](batch, how.max_tokens, split=how.split)
    for mb in rows:  # every micro-batch; in a job: this rank's share of the rows, then padding ones
        rows.put(pass_logprobs(model, how, mb))  # [b, l]
    old = rows.whole()  # [B, L]; in a job: gathered from every rank
    return old, score_reference(ref, batch, how)


@torch.no_grad()
def score_reference(ref: ReferenceModel | None, batch: TokenBatch, how: ScoringPass) -> Tensor | None:
    """log pi_ref [B, L] at the rollout temperature (no grad), or None when there is no reference."""
    if ref is None:
        return None
    with ref.active() as ref_model:
        rows = RowResults[Tensor](batch, how.max_tokens, split=how.split)
        for mb in rows:
            rows.put(pass_logprobs(ref_model, how, mb))  # [b, l]
        return rows.whole()


@torch.no_grad()
def score_values(critic: torch.nn.Module, batch: TokenBatch, how: ScoringPass) -> Tensor:
    """Raw outputs [B, L] of a critic with its own backbone (no grad): see :func:`critic_forward`."""
    rows = RowResults[Tensor](batch, how.max_tokens, split=how.split)
    for mb in rows:
        rows.put(critic_forward(critic, mb, packed=how.packed))  # [b, l]
    return rows.whole()


@torch.no_grad()
def score_shared(model: torch.nn.Module, critic: ValueModel, batch: TokenBatch, how: ScoringPass,
                 max_feature_bytes: int = 2**31) -> tuple[Tensor, Tensor, Tensor | None]:
    """The scoring pass of a critic that shares the policy's backbone: ONE backbone forward per
    micro-batch gives (log pi_old [B, L], raw critic outputs [B, L], features [B, L, H] or None).

    The same numbers as :func:`score_logprobs` (old) and :func:`score_values`, for one backbone
    pass instead of two. The features let :func:`critic_update` train the head without
    running the backbone again (the backbone does not change before the actor update, which comes
    after the critic's). They are float32, B * L * H values: 10 MB for a batch of the default run, but 17 GB
    for 256 rows of 8k tokens of a 2048-wide model, so above ``max_feature_bytes`` they are not
    kept (None) and the critic update runs the backbone (without a graph) instead.
    """
    model.eval()
    B, L = batch.input_ids.shape
    keep = B * L * critic.value_head.in_features * 4 <= max_feature_bytes
    rows = RowResults[tuple[Tensor, ...]](batch, how.max_tokens, split=how.split)
    for mb in rows:
        rows.put(_shared_pass(model, critic, how, keep, mb))  # ([b, l], [b, l], [b, l, H] if keep)
    out = rows.whole()
    return out[0], out[1], out[2] if keep else None


def _shared_pass(model: torch.nn.Module, critic: ValueModel, how: ScoringPass, keep: bool,
                 mb: TokenBatch) -> tuple[Tensor, ...]:
    """One micro-batch of :func:`score_shared`, through the model's FSDP2 root when sharded."""
    return on_root(model, _shared_forward, model, critic, how, keep, mb)


def _shared_forward(model: torch.nn.Module, critic: ValueModel, how: ScoringPass, keep: bool,
                    mb: TokenBatch) -> tuple[Tensor, ...]:
    """(log pi_old [b, l], raw values [b, l], features [b, l, H] if ``keep``) of one backbone pass."""
    hidden = forward_hidden(model, mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw,
                            packed=how.packed)
    lp, _ = policy_forward(model, mb, how.chunk, temperature=how.temperature, hidden=hidden)
    return (lp, critic.values_from_hidden(hidden)) + ((hidden,) if keep else ())


def critic_forward(critic: torch.nn.Module, mb: TokenBatch, packed: bool = False) -> Tensor:
    """Raw critic outputs [B, L] float32 (``out[:, t]``: value of the prefix ending at t); ``packed``:
    the backbone runs without padding (update.packing)."""
    return on_root(critic, critic, mb.input_ids, mb.attention_mask, mb.pixel_values, mb.image_grid_thw,
                   packed=packed)


@overload
def score_batch(model: torch.nn.Module, critic: ValueModel, ref: ReferenceModel | None, batch: TokenBatch,
                update_cfg: UpdateConfig, temperature: float) -> PPOScores: ...
@overload
def score_batch(model: torch.nn.Module, critic: None, ref: ReferenceModel | None, batch: TokenBatch,
                update_cfg: UpdateConfig, temperature: float) -> Scores: ...
@torch.no_grad()
def score_batch(model: torch.nn.Module, critic: ValueModel | None, ref: ReferenceModel | None, batch: TokenBatch,
                update_cfg: UpdateConfig, temperature: float) -> Scores:
    """Stage 3 of an RL step, the no-grad scoring passes: log pi_old and log pi_ref (with a
    reference model) at the rollout temperature, and with a critic V_old before each sampled token
    and V(final observation) of truncated rows. A critic that shares the policy's backbone reads
    its values off the policy's pass and keeps that pass's features for its head's update (with a
    critic: a ``PPOScores``)."""
    # a job: each rank scores its share of the rows, all get the whole result
    how = ScoringPass(update_cfg.micro_batch_tokens, update_cfg.logprob_chunk, temperature, update_cfg.packing,
                      split=world().distributed)
    if critic is None:
        old, ref_logprobs = score_logprobs(model, ref, batch, how)
        return Scores(old_logprobs=old, ref_logprobs=ref_logprobs)
    critic.eval()
    features = None
    if critic.shares_backbone:
        old, raw_values, features = score_shared(model, critic, batch, how)
        ref_logprobs = score_reference(ref, batch, how)
    else:
        old, ref_logprobs = score_logprobs(model, ref, batch, how)
        raw_values = score_values(critic, batch, how)
    values = shift_right(raw_values) * batch.loss_mask  # V before each sampled token
    final = raw_values.gather(1, batch.bootstrap_index.clamp(min=0)[:, None])[:, 0]  # [B]
    final = torch.where(batch.truncated, final, torch.zeros_like(final))
    return PPOScores(old_logprobs=old, ref_logprobs=ref_logprobs, values=values, final_values=final, features=features)
