"""Policy, value and KL losses, and memory-light log-probs/entropy from logits.

Shapes: B sequences x L tokens; ``mask`` [B, L] bool or 0/1 is the loss mask (1 iff the policy
sampled the token). Inputs may be float32 or bfloat16; the arithmetic runs in float32 and every
returned tensor is float32. Losses return named stats (detached 0-dim tensors, so logging does not
force a GPU sync until the recipe calls ``.metrics()``).

Aggregation (``agg``), made explicit because it changes the gradient (DAPO arXiv 2503.14476 sec 3.3,
Dr. GRPO arXiv 2503.20783):

- ``"token-mean"``: ``sum_{b,t} M l / sum_{b,t} M`` (every token weighs the same; VAGEN, DAPO).
- ``"seq-mean-token-sum"``: ``mean_b sum_t M l`` (long sequences weigh more).
- ``"seq-mean-token-mean"``: ``mean_b (sum_t M l / sum_t M)`` (every sequence weighs the same;
  original GRPO).

The sequence means average over rows with at least one M=1 token (an all-padding row does not
dilute the loss); an empty mask gives a loss of 0 that still backpropagates (zeros).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "PolicyLoss",
    "ValueLoss",
    "aggregate",
    "entropy_from_logits",
    "explained_variance",
    "kl_penalty",
    "logprobs_from_logits",
    "ppo_policy_loss",
    "value_loss",
]

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_KINDS = ("k1", "k2", "k3", "low_var_kl")
_MAX_LOG_RATIO = 20.0  # clamp log(pi/pi_old) before exp, as verl, so a stale token cannot overflow


def _mean(x: Tensor, m: Tensor) -> Tensor:
    """Token mean over M=1 (0 for an empty mask), detached: for statistics only."""
    x = torch.where(m, x.detach().float(), 0.0)
    return x.sum() / m.sum().clamp(min=1)


def aggregate(loss_mat: Tensor, mask: Tensor, agg: str) -> Tensor:
    """Reduce a per-token loss [B, L] to a scalar under the loss mask [B, L] (see module doc).

    Values at M=0 are ignored even if inf/nan. Unknown ``agg`` -> ValueError listing the modes.
    """
    m = mask.bool()
    lm = torch.where(m, loss_mat.float(), 0.0)  # M * l, without nan leaking from padding
    if agg == "token-mean":
        return lm.sum() / m.sum().clamp(min=1)  # sum_{b,t} M l / sum M
    if agg not in AGG_MODES:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    tokens = m.sum(-1)  # [B] sampled tokens per row
    per_seq = lm.sum(-1)  # sum_t M l
    if agg == "seq-mean-token-mean":
        per_seq = per_seq / tokens.clamp(min=1)  # sum_t M l / sum_t M
    return per_seq.sum() / (tokens > 0).sum().clamp(min=1)  # mean over non-empty rows


class PolicyLoss(NamedTuple):
    """Output of :func:`ppo_policy_loss`. ``loss`` is differentiable; the rest are detached
    0-dim float32 tensors, token means over M (see ``metrics()`` for their logged names)."""

    loss: Tensor  # scalar to minimise
    clip_frac: Tensor  # tokens where a PPO clip bound was active (zero gradient)
    clip_frac_lower: Tensor  # A < 0 and r < 1 - clip_low
    clip_frac_upper: Tensor  # A > 0 and r > 1 + clip_high
    dual_clip_frac: Tensor  # A < 0 and r > dual_clip: the dual-clip bound was active
    approx_kl: Tensor  # k3 estimate of KL(pi_old || pi): mean of (r - 1) - log r
    ratio_mean: Tensor  # mean of r = pi / pi_old
    ratio_max: Tensor  # max of r over M (0 for an empty mask)

    def metrics(self, prefix: str = "loss/") -> dict[str, float]:
        """Python floats for logging: ``loss/policy``, ``loss/clip_frac``, ... (one sync)."""
        vals = torch.stack([t.detach().float() for t in self]).tolist()
        names = ["policy"] + list(self._fields[1:])
        return {prefix + k: v for k, v in zip(names, vals)}


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    weights: Tensor | None = None,
) -> PolicyLoss:
    """PPO clipped surrogate (Schulman et al., arXiv 1707.06347) with clip-higher (DAPO, arXiv
    2503.14476: ``clip_high > clip_low``, ViGoRL uses 0.2/0.28) and dual-clip (Ye et al., arXiv
    1912.09729: bounds the loss of a negative advantage at ``dual_clip * |A|``, ViGoRL c=3)::

        r_t = exp(logp_t - logp_old_t)
        l_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))
        if dual_clip and A_t < 0:  l_t = min(l_t, -A_t * dual_clip)
        l_t = w_t * l_t                    (``weights``: rollout-correction IS weights, if given)
        loss = aggregate(l, M, agg)        (minimising it maximises docs/algorithms.md reference section 6's J)

    Args:
        logprobs: [B, L] log pi(a_t) under the current policy (requires grad).
        old_logprobs: [B, L] the log-probs the ratio is taken against (no grad): log pi_old, the
            trainer's own forward of the sampled tokens before the update (the recipes recompute
            it), or the engine's sampling-time (behaviour) log-probs of an overlapped rollout
            (``vagent.recipes.stages.off_policy``).
        advantages: [B, L] (whitened by the recipe if desired).
        mask: [B, L] loss mask.
        clip_low, clip_high: epsilon below and above 1. dual_clip: c > 1, or None to disable.
        agg: one of ``AGG_MODES``.
        weights: [B, L] per-token importance weights on the loss (truncated IS of
            ``vagent.rl.correction``; detached), or None (all 1).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (ViGoRL uses 3.0) or None, got {dual_clip}")
    m = mask.bool()
    adv = advantages.detach().float()
    log_ratio = (logprobs.float() - old_logprobs.detach().float()).clamp(
        -_MAX_LOG_RATIO, _MAX_LOG_RATIO
    )
    ratio = torch.exp(log_ratio)  # r_t = pi / pi_old
    loss_unclipped = -adv * ratio  # -A r
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # -A clip(r)
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)  # pessimistic bound
    dual = torch.zeros_like(m)
    if dual_clip is not None:
        cap = -adv * dual_clip  # |A| c for A < 0
        dual = (adv < 0) & (loss_mat > cap)  # dual-clip bound active
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, cap), loss_mat)
    if weights is not None:
        loss_mat = loss_mat * weights.detach().float()  # w_t l_t (verl: pg_losses * rollout_is_weights)
    r = ratio.detach()
    lower = (adv < 0) & (r < 1.0 - clip_low)
    upper = (adv > 0) & (r > 1.0 + clip_high)
    return PolicyLoss(
        loss=aggregate(loss_mat, m, agg),
        clip_frac=_mean((lower | upper).float(), m),
        clip_frac_lower=_mean(lower.float(), m),
        clip_frac_upper=_mean(upper.float(), m),
        dual_clip_frac=_mean(dual.float(), m),
        approx_kl=_mean((r - 1.0) - log_ratio.detach(), m),  # k3 of KL(pi_old || pi)
        ratio_mean=_mean(r, m),
        ratio_max=torch.where(m, r, 0.0).max() if m.numel() else torch.zeros(()),
    )


class ValueLoss(NamedTuple):
    """Output of :func:`value_loss`; ``loss`` is differentiable, the rest detached 0-dim."""

    loss: Tensor
    clip_frac: Tensor  # tokens where the clipped error was the larger one
    value_mean: Tensor  # mean V over M
    return_mean: Tensor  # mean R over M

    def metrics(self, prefix: str = "loss/") -> dict[str, float]:
        """Python floats: ``loss/value``, ``loss/value_clip_frac``, ``loss/value_mean``, ``loss/return_mean``."""
        names = ["value", "value_clip_frac", "value_mean", "return_mean"]
        vals = torch.stack([t.detach().float() for t in self]).tolist()
        return {prefix + k: v for k, v in zip(names, vals)}


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.5,
    agg: str = "token-mean",
) -> ValueLoss:
    """Clipped value loss (PPO, arXiv 1707.06347; as in verl/CleanRL, on which VAGEN builds)::

        V_clip = V_old + clip(V - V_old, -clip, clip)
        l_t = 0.5 * max((V - R)^2, (V_clip - R)^2)        (clip=None: 0.5 (V - R)^2)
        loss = aggregate(l, M, agg)

    The 0.5 makes the gradient (V - R); docs/algorithms.md reference section 6 writes the loss without it (a
    constant factor of the critic learning rate).

    ``mask`` must be where returns are DEFINED (docs/algorithms.md reference section 11 bug 3): the loss mask for
    masked/bi-level GAE, ``turn_end_mask`` for :func:`turn_gae`, :func:`anchor_mask` for
    :func:`no_concat_gae`. All tensors [B, L]; ``values`` requires grad. The explained variance is
    not a micro-batch statistic (a ratio of variances): :func:`explained_variance`, once per batch.
    """
    m = mask.bool()
    v = values.float()
    R = returns.detach().float()
    err = (v - R) ** 2
    if clip is None:
        loss_mat, clipped = 0.5 * err, torch.zeros_like(m)
    else:
        v_old = old_values.detach().float()
        v_clip = v_old + (v - v_old).clamp(-clip, clip)  # V_old + clip(V - V_old)
        err_clip = (v_clip - R) ** 2
        loss_mat = 0.5 * torch.maximum(err, err_clip)
        clipped = err_clip > err
    return ValueLoss(
        loss=aggregate(loss_mat, m, agg),
        clip_frac=_mean(clipped.float(), m),
        value_mean=_mean(v, m),
        return_mean=_mean(R, m),
    )


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the M=1 positions of ``mask`` [B, L] (population variances,
    as CleanRL), of values and returns [B, L]; nan when fewer than 2 positions or Var(R) is 0. One
    number per batch (PPO's ``critic/explained_variance``), never per micro-batch."""
    m = mask.bool()
    R, V = returns[m].float(), values[m].float()
    if R.numel() < 2 or float(R.var(unbiased=False)) == 0.0:
        return float("nan")
    return float(1.0 - (R - V).var(unbiased=False) / R.var(unbiased=False))


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL
    Divergence", 2020), elementwise [B, L] float32. With ``log_r = logp_ref - logp``::

        k1 = -log_r                          unbiased, high variance, can be negative
        k2 = 0.5 * log_r^2                   biased, low variance
        k3 = (exp(log_r) - 1) - log_r        unbiased, low variance, >= 0 ("low_var_kl")

    k3 clamps ``log_r`` to [-20, 20] and the result to [-10, 10], as verl's low_var_kl.
    ViGoRL puts k3 in the loss with coefficient 0.01; legacy VAGEN put a KL in the reward.
    """
    logp, ref = logprobs.float(), ref_logprobs.float()
    if kind == "k1":
        return logp - ref  # log pi - log pi_ref
    if kind == "k2":
        return 0.5 * (logp - ref) ** 2
    if kind in ("k3", "low_var_kl"):
        log_r = (ref - logp).clamp(-20.0, 20.0)  # log(pi_ref / pi)
        return (torch.exp(log_r) - 1.0 - log_r).clamp(-10.0, 10.0)
    raise ValueError(f"kind must be one of {KL_KINDS}, got {kind!r}")


# ----------------------------------------------------------------------------------------------
# log-probs and entropy from logits, chunked so no full [B, L, V] float32 copy exists
# ----------------------------------------------------------------------------------------------


def _blocks(shape: torch.Size, chunk_size: int):
    """(rows, cols) slices of a [B, L, V] tensor covering at most chunk_size positions each:
    whole rows grouped when L <= chunk_size, else pieces of one row."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    B, L = shape[0], shape[1]
    if L <= chunk_size:
        step = max(1, chunk_size // max(L, 1))
        for b0 in range(0, B, step):
            yield slice(b0, b0 + step), slice(0, L)
    else:
        for b in range(B):
            for l0 in range(0, L, chunk_size):
                yield slice(b, b + 1), slice(l0, l0 + chunk_size)


def _as3d(logits: Tensor) -> Tensor:
    if logits.dim() == 2:
        return logits.unsqueeze(0)  # [N, V] -> [1, N, V]
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, L, V] or [N, V], got {tuple(logits.shape)}")
    return logits


class _ChunkedLogProb(torch.autograd.Function):
    """log softmax(x)[label] per position; forward and backward upcast one chunk at a time."""

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, chunk_size: int) -> Tensor:
        out = torch.empty(logits.shape[:2], dtype=torch.float32, device=logits.device)
        for rows, cols in _blocks(logits.shape, chunk_size):
            x = logits[rows, cols].float()  # [b, l, V] float32, one chunk
            picked = x.gather(-1, labels[rows, cols, None])[..., 0]  # x[label]
            out[rows, cols] = picked - torch.logsumexp(x, -1)  # log p(label) = x[label] - lse(x)
        ctx.save_for_backward(logits, labels)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        logits, labels = ctx.saved_tensors
        g_logits = torch.empty_like(logits)
        for rows, cols in _blocks(logits.shape, ctx.chunk_size):
            g = grad[rows, cols, None].float()  # [b, l, 1]
            gx = -torch.softmax(logits[rows, cols].float(), -1) * g  # d/dx = onehot(label) - p
            gx.scatter_add_(-1, labels[rows, cols, None], g)
            g_logits[rows, cols] = gx.to(g_logits.dtype)
        return g_logits, None, None


class _ChunkedEntropy(torch.autograd.Function):
    """H(softmax(x)) per position; dH/dx_j = -p_j (log p_j + H), recomputed per chunk."""

    @staticmethod
    def forward(ctx, logits: Tensor, chunk_size: int) -> Tensor:
        out = torch.empty(logits.shape[:2], dtype=torch.float32, device=logits.device)
        for rows, cols in _blocks(logits.shape, chunk_size):
            x = logits[rows, cols].float()
            p = torch.softmax(x, -1)
            out[rows, cols] = torch.logsumexp(x, -1) - (p * x).sum(-1)  # H = lse(x) - sum p x
        ctx.save_for_backward(logits)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (logits,) = ctx.saved_tensors
        g_logits = torch.empty_like(logits)
        for rows, cols in _blocks(logits.shape, ctx.chunk_size):
            logp = torch.log_softmax(logits[rows, cols].float(), -1)
            p = logp.exp()
            H = -(p * logp).sum(-1, keepdim=True)
            gx = -p * (logp + H) * grad[rows, cols, None].float()  # -p_j (log p_j + H) dL/dH
            g_logits[rows, cols] = gx.to(g_logits.dtype)
        return g_logits, None


def logprobs_from_logits(logits: Tensor, labels: Tensor, chunk_size: int = 512) -> Tensor:
    """Log-probability of the chosen tokens: ``log softmax(logits)[labels]``.

    Args:
        logits: [B, L, V] (or [N, V]) float32 or bf16; any strides (a slice like
            ``logits[:, :-1]`` is read in place, never copied whole).
        labels: [B, L] (or [N]) long in [0, V): mask out padding afterwards, do not pass -100.
        chunk_size: positions upcast to float32 at once (memory ~ 2 x chunk_size x V x 4 bytes);
            whole rows are grouped when L <= chunk_size.
    Returns:
        [B, L] (or [N]) float32, differentiable: the backward recomputes the softmax per chunk
        instead of keeping float32 copies of the logits.
    """
    x = _as3d(logits)
    out = _ChunkedLogProb.apply(x, labels.reshape(x.shape[:2]).long(), chunk_size)
    return out.reshape(labels.shape)


def entropy_from_logits(logits: Tensor, chunk_size: int = 512) -> Tensor:
    """Entropy of the softmax of each row, ``H = logsumexp(x) - sum_j softmax(x)_j x_j``.

    Shapes and memory as :func:`logprobs_from_logits`: [B, L, V] -> [B, L] (or [N, V] -> [N])
    float32, differentiable (for an entropy bonus; the paper uses coefficient 0.001).
    """
    x = _as3d(logits)
    out = _ChunkedEntropy.apply(x, chunk_size)
    return out.reshape(logits.shape[:-1])
