"""``TokenBatch``: episodes as padded token rows with loss masks, rewards and images.

How episodes become rows (:func:`build_token_batch`):

- ``mode="concat"``: one row per episode, the tokens of its single sample Conversation
  ``[system][obs_0][reply_0][end][obs_1][reply_1][end]...``; the ``k``-th sampled segment is turn
  ``k``.
- ``mode="no_concat"`` or ``"window"``: one row per turn, the tokens of the turn's own sample
  (system + current observation, or system + the last ``k`` turns as mask-0 context + current
  observation); the row's single sampled segment is its turn; ``row_turn`` = that turn.
- Truncated episodes (a limit, not a terminal state): with ``append_final_observation`` the
  encoded final observation (``Episode.final_segment``, mask 0) is appended to the episode's
  (last) row and ``bootstrap_index`` points at its last token (the assistant generation prompt),
  whose value ``V(s_T)`` bootstraps the return. ``truncated`` is True on that row only.
- Episodes with ``error`` are excluded (``n_error_episodes``), as are episodes with no turn
  (``n_empty_episodes``: e.g. the context limit hit before the first reply). When none is left,
  :class:`NoTrainableEpisodesError` says so in one line naming the first error's own line
  (:func:`~vagent.rollout.records.error_headline`), or, when every episode failed for a missing
  optional dependency (an ``ImportError``), that dependency's line.

Per-token tensors, for the row's token at position ``p``:

- ``loss_mask[p]`` is True iff the policy sampled the token (segments with ``sampled=True``);
  system, observation, image and template tokens are never trained on (docs/algorithms.md reference bug 5);
- ``old_logprobs[p]`` is its sampling-time log-prob (0 elsewhere);
- ``turn_end_mask[p]`` marks the last sampled token of each turn (``e_k``);
- ``token_rewards[e_k]`` = ``Turn.reward`` of turn ``k`` (env reward + reasoning rewards);
  every other position 0;
- ``turn_index[p]`` = turn number of a sampled token, -1 elsewhere.

Images: ``pixel_values`` [P, D] are all rows' images in row order (then image order within the
row), ``image_grid_thw`` [n_images, 3]; ``n_images[b]`` counts row ``b``'s images, so
:meth:`TokenBatch.select` re-slices pixels with their rows. An image's tokens and pixels live in
one segment and are never separated (docs/algorithms.md reference bug 7).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import NamedTuple, Sequence

import torch
from torch import Tensor

from vagent.envs.base import state_key
from vagent.rollout.policy import Conversation, Segment
from vagent.rollout.records import Episode, Turn, error_headline

BATCH_MODES = ("concat", "no_concat", "window")


@dataclass
class TokenBatch:
    """Padded training rows (see the module docstring). B rows, L positions, right-padded."""

    input_ids: Tensor  # [B, L] long, right-padded with pad_token_id
    attention_mask: Tensor  # [B, L] long: 1 on real tokens
    loss_mask: Tensor  # [B, L] bool: True only at tokens the policy sampled
    old_logprobs: Tensor  # [B, L] float32: sampling-time log-prob at loss_mask positions, 0 elsewhere
    turn_end_mask: Tensor  # [B, L] bool: last sampled token of each turn
    token_rewards: Tensor  # [B, L] float32: each turn's reward on its turn-end token
    turn_index: Tensor  # [B, L] long: turn number of each sampled token, -1 elsewhere
    bootstrap_index: Tensor  # [B] long: last position of the appended final observation, -1 if none
    truncated: Tensor  # [B] bool: trajectory cut by a limit (set on its last row only)
    episode_returns: Tensor  # [B] float32: the trajectory's return (sum of its turn rewards)
    group_ids: Tensor  # [B] long
    traj_ids: Tensor  # [B] long
    row_turn: Tensor  # [B] long: the row's turn in per-turn modes, -1 in concat
    pixel_values: Tensor | None  # [P, D] all images' patches, in row order then image order
    image_grid_thw: Tensor | None  # [n_images, 3] long
    state_keys: list[list[str]]  # per row, per turn in the row: state_key(turn.state_before)
    n_images: Tensor  # [B] long: images of each row (their pixels are contiguous, in row order)
    episode_index: Tensor  # [B] long: index of the row's episode in build_token_batch's list
    #: episodes left out because they had an error / no turn
    n_error_episodes: int = 0
    n_empty_episodes: int = 0

    # ------------------------------------------------------------------ shape helpers
    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    def __len__(self) -> int:
        return self.batch_size

    @property
    def lengths(self) -> Tensor:
        """[B] number of real (non-pad) tokens of each row."""
        return self.attention_mask.long().sum(1)

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.long().sum())

    def to(self, device: str | torch.device) -> "TokenBatch":
        """A copy with every tensor on ``device``."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if isinstance(v, Tensor):
                moved[k] = v.to(device)
        return TokenBatch(**moved)

    def _image_rows(self) -> list[tuple[int, int]]:
        """Per row: (first patch, end patch) in ``pixel_values``; and validates the image layout."""
        counts = self.n_images.tolist()
        if self.image_grid_thw is None:
            if any(counts):
                raise ValueError("TokenBatch: rows have images but image_grid_thw is None")
            return [(0, 0)] * len(counts)
        patches = self.image_grid_thw.long().prod(-1).tolist()
        if sum(counts) != len(patches):
            raise ValueError(f"TokenBatch: n_images sums to {sum(counts)} but image_grid_thw has {len(patches)} rows")
        out, img, patch = [], 0, 0
        for c in counts:
            n = sum(patches[img: img + c])
            out.append((patch, patch + n))
            img, patch = img + c, patch + n
        return out

    def select(self, rows: Sequence[int] | Tensor) -> "TokenBatch":
        """The rows ``rows`` (in that order), trimmed to their longest row; images re-sliced."""
        idx = torch.as_tensor(list(rows) if not isinstance(rows, Tensor) else rows, dtype=torch.long)
        if idx.numel() == 0:
            raise ValueError("select() needs at least one row")
        if int(idx.min()) < 0 or int(idx.max()) >= self.batch_size:
            raise IndexError(f"select(): rows must be in [0, {self.batch_size}), got {idx.tolist()}")
        length = max(1, int(self.lengths[idx].max()))
        pixel_values: Tensor | None = None
        grid: Tensor | None = None
        if self.image_grid_thw is not None:
            if self.pixel_values is None:
                raise ValueError("TokenBatch: image_grid_thw is set but pixel_values is None; build the batch "
                                 "with build_token_batch, which sets both or neither")
            ranges = self._image_rows()
            first_image = torch.cumsum(self.n_images, 0) - self.n_images
            patch_idx = torch.cat([torch.arange(*ranges[r]) for r in idx.tolist()])
            image_idx = torch.cat([torch.arange(int(first_image[r]), int(first_image[r] + self.n_images[r]))
                                   for r in idx.tolist()])
            if image_idx.numel():
                pixel_values = self.pixel_values.index_select(0, patch_idx.to(self.pixel_values.device))
                grid = self.image_grid_thw.index_select(0, image_idx.to(self.image_grid_thw.device))
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("pixel_values", "image_grid_thw"):
                continue
            if isinstance(v, Tensor):
                v = v.index_select(0, idx.to(v.device))
                if v.dim() == 2:
                    v = v[:, :length]
            elif f.name == "state_keys":
                v = [list(v[r]) for r in idx.tolist()]
            out[f.name] = v
        return TokenBatch(pixel_values=pixel_values, image_grid_thw=grid, **out)


# ---------------------------------------------------------------------- building
@dataclass
class _Row:
    ids: list[int]
    loss: list[bool]
    logprobs: list[float]
    turn_end: list[bool]
    rewards: list[float]
    turn_index: list[int]
    pixels: list[Tensor]
    grids: list[Tensor]
    n_images: int = 0
    bootstrap: int = -1


def _row_from_segments(segments: Sequence[Segment], turns: Sequence[Turn], first_turn: int,
                       where: str) -> tuple[_Row, int]:
    """Lay out ``segments`` as one row; the sampled segments are turns ``first_turn, first_turn+1, ...``."""
    row = _Row([], [], [], [], [], [], [], [])
    k = first_turn
    for seg in segments:
        n = len(seg.input_ids)
        row.ids += seg.input_ids
        if seg.sampled:
            if k >= len(turns):
                raise ValueError(f"{where}: more sampled segments than turns ({len(turns)})")
            if seg.logprobs is None or len(seg.logprobs) != n or n == 0:
                raise ValueError(f"{where}: sampled segment of turn {k} has {n} ids and "
                                 f"{None if seg.logprobs is None else len(seg.logprobs)} logprobs")
            row.loss += [True] * n
            row.logprobs += [float(x) for x in seg.logprobs]
            row.turn_end += [False] * (n - 1) + [True]
            row.rewards += [0.0] * (n - 1) + [float(turns[k].reward)]
            row.turn_index += [k] * n
            k += 1
        else:
            row.loss += [False] * n
            row.logprobs += [0.0] * n
            row.turn_end += [False] * n
            row.rewards += [0.0] * n
            row.turn_index += [-1] * n
        if seg.n_images:
            if seg.pixel_values is None or seg.image_grid_thw is None or int(seg.image_grid_thw.shape[0]) != seg.n_images:
                raise ValueError(f"{where}: a segment with {seg.n_images} image(s) lacks matching pixels/grid")
            row.pixels.append(seg.pixel_values)
            row.grids.append(seg.image_grid_thw)
            row.n_images += seg.n_images
    return row, k


def _append_final(row: _Row, seg: Segment) -> None:
    tail, _ = _row_from_segments([seg], [], 0, "final observation")
    for name in ("ids", "loss", "logprobs", "turn_end", "rewards", "turn_index", "pixels", "grids"):
        getattr(row, name).extend(getattr(tail, name))
    row.n_images += tail.n_images
    row.bootstrap = len(row.ids) - 1


def _episode_rows(ep: Episode, samples: Sequence[Conversation], per_turn: bool, append_final: bool,
                  where: str) -> list[_Row]:
    n_sampled = sum(s.sampled for c in samples for s in c.segments)
    if n_sampled != len(ep.turns):
        hint = (" Token rows need a token-level policy (HFPolicy, TokenScriptedPolicy): text policies "
                "record no segments." if n_sampled == 0 else "")
        raise ValueError(f"{where}: {n_sampled} sampled segments for {len(ep.turns)} turns.{hint}")
    if per_turn and len(samples) != len(ep.turns):
        raise ValueError(f"{where}: per-turn mode needs one sample per turn, got {len(samples)} for "
                         f"{len(ep.turns)} turns (was it rolled out with mode='concat' and no window?)")
    if not per_turn and len(samples) != 1:
        raise ValueError(f"{where}: concat mode needs one sample per episode, got {len(samples)} "
                         "(use mode='no_concat' or 'window' for per-turn samples)")
    rows, k = [], 0
    for c in samples:
        row, k_next = _row_from_segments(c.segments, ep.turns, k, where)
        if per_turn and k_next != k + 1:
            raise ValueError(f"{where}: a per-turn sample must hold exactly one sampled segment")
        rows.append(row)
        k = k_next
    if append_final and ep.truncated:
        if ep.final_segment is None:
            raise ValueError(f"{where}: truncated episode has no final_segment to bootstrap from; roll it "
                             "out with a token-level policy, or pass append_final_observation=False")
        _append_final(rows[-1], ep.final_segment)
    return rows


def build_token_batch(
    episodes: Sequence[Episode],
    samples: Sequence[Sequence[Conversation]] | None = None,
    mode: str = "concat",
    pad_token_id: int | None = None,
    append_final_observation: bool = True,
) -> TokenBatch:
    """Pad episodes into a :class:`TokenBatch` (see the module docstring).

    Args:
        episodes: rolled-out episodes (errored ones are skipped and counted).
        samples: per episode its sample conversations; default ``episode.samples``.
        mode: ``"concat"`` (one row per episode) or ``"no_concat"`` / ``"window"`` (one per turn):
            the rollout's ``mode``, with ``"window"`` for ``mode="concat", window=k``.
        pad_token_id: the tokenizer's pad id (``encoder.pad_token_id``); required.
        append_final_observation: append truncated episodes' final observation for bootstrap.
    """
    if mode not in BATCH_MODES:
        raise ValueError(f"mode must be one of {BATCH_MODES}, got {mode!r}")
    if pad_token_id is None:
        raise TypeError("build_token_batch needs pad_token_id= (e.g. policy.encoder.pad_token_id)")
    if samples is not None and len(samples) != len(episodes):
        raise ValueError(f"got {len(samples)} sample lists for {len(episodes)} episodes")
    rows, origins, n_error, n_empty = _rows(episodes, samples, mode != "concat", append_final_observation)
    if not rows:
        raise NoTrainableEpisodesError(_no_rows_line(episodes, n_error, n_empty))
    return _pad(rows, origins, pad_token_id, n_error, n_empty)


class NoTrainableEpisodesError(ValueError):
    """No episode of a batch can be trained on (each failed or has no turn); the message is one line."""


#: an episode error's headline for a missing module: ``env: ImportError: ...`` (the prefix is optional)
_MISSING_DEPENDENCY = re.compile(r"^(\w+: )?(ImportError|ModuleNotFoundError): ")


def _no_rows_line(episodes: Sequence[Episode], n_error: int, n_empty: int) -> str:
    """Why no episode is trainable, in one line: the missing optional dependency every episode
    failed on, else the counts and the first error's own line."""
    errors = [error_headline(ep.error) for ep in episodes if ep.error is not None]
    if errors and n_error == len(episodes) and all(_MISSING_DEPENDENCY.match(e) for e in errors):
        return f"every episode of the rollout ({n_error}) failed for a missing optional dependency: {errors[0]}"
    first = f"; first error: {errors[0]}" if errors else ""
    return f"no trainable episodes: {n_error} with error, {n_empty} without a turn, {len(episodes)} in all{first}"


class _RowOrigin(NamedTuple):
    """Where a row comes from: the per-row fields of the batch that are not per token."""

    episode_index: int
    episode: Episode
    row_turn: int  # the row's turn in per-turn modes, -1 in concat
    truncated: bool  # the episode was truncated and this is its last row
    state_keys: list[str]


def _rows(episodes: Sequence[Episode], samples: Sequence[Sequence[Conversation]] | None, per_turn: bool,
          append_final: bool) -> tuple[list[_Row], list[_RowOrigin], int, int]:
    """(rows, their origins, episodes with an error, episodes without a turn), in episode order."""
    rows: list[_Row] = []
    origins: list[_RowOrigin] = []
    n_error = n_empty = 0
    for e, ep in enumerate(episodes):
        if ep.error is not None:
            n_error += 1
            continue
        if not ep.turns:
            n_empty += 1
            continue
        where = f"episode {e} (traj {ep.traj_id})"
        ep_rows = _episode_rows(ep, ep.samples if samples is None else samples[e], per_turn, append_final, where)
        keys = [state_key(t.state_before) for t in ep.turns]
        for r, row in enumerate(ep_rows):
            last = r == len(ep_rows) - 1
            origins.append(_RowOrigin(e, ep, r if per_turn else -1, ep.truncated and last,
                                      [keys[r]] if per_turn else keys))
            rows.append(row)
    return rows, origins, n_error, n_empty


def _pad(rows: list[_Row], origins: list[_RowOrigin], pad_token_id: int, n_error: int, n_empty: int) -> TokenBatch:
    B, L = len(rows), max(len(r.ids) for r in rows)

    def full(value: float, dtype: torch.dtype) -> Tensor:
        return torch.full((B, L), value, dtype=dtype)

    input_ids, attention = full(pad_token_id, torch.long), full(0, torch.long)
    loss, logprobs, turn_end = full(False, torch.bool), full(0.0, torch.float32), full(False, torch.bool)
    rewards, turn_index = full(0.0, torch.float32), full(-1, torch.long)
    for b, r in enumerate(rows):
        n = len(r.ids)
        input_ids[b, :n] = torch.tensor(r.ids, dtype=torch.long)
        attention[b, :n] = 1
        loss[b, :n] = torch.tensor(r.loss, dtype=torch.bool)
        logprobs[b, :n] = torch.tensor(r.logprobs, dtype=torch.float32)
        turn_end[b, :n] = torch.tensor(r.turn_end, dtype=torch.bool)
        rewards[b, :n] = torch.tensor(r.rewards, dtype=torch.float32)
        turn_index[b, :n] = torch.tensor(r.turn_index, dtype=torch.long)
    pixels = [p for r in rows for p in r.pixels]
    grids = [g for r in rows for g in r.grids]
    return TokenBatch(
        input_ids=input_ids, attention_mask=attention, loss_mask=loss, old_logprobs=logprobs,
        turn_end_mask=turn_end, token_rewards=rewards, turn_index=turn_index,
        bootstrap_index=torch.tensor([r.bootstrap for r in rows], dtype=torch.long),
        truncated=torch.tensor([o.truncated for o in origins], dtype=torch.bool),
        episode_returns=torch.tensor([o.episode.total_reward for o in origins], dtype=torch.float32),
        group_ids=torch.tensor([o.episode.group_id for o in origins], dtype=torch.long),
        traj_ids=torch.tensor([o.episode.traj_id for o in origins], dtype=torch.long),
        row_turn=torch.tensor([o.row_turn for o in origins], dtype=torch.long),
        pixel_values=torch.cat(pixels, 0) if pixels else None,
        image_grid_thw=torch.cat(grids, 0).long() if grids else None,
        state_keys=[o.state_keys for o in origins],
        n_images=torch.tensor([r.n_images for r in rows], dtype=torch.long),
        episode_index=torch.tensor([o.episode_index for o in origins], dtype=torch.long),
        n_error_episodes=n_error, n_empty_episodes=n_empty,
    )


__all__ = ["TokenBatch", "build_token_batch", "BATCH_MODES"]
