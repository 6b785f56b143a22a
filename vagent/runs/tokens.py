"""The token dump: what each sampled row was trained on, for ``vagent view`` (``vagent.viewer``).

At the rollout-dump schedule (``log.rollouts_every``, decided by the caller with
``vagent.runs.rundir.due``) the recipes call :func:`save_token_rows` for that RL step, after the
advantages are computed. It writes
``rollouts/step_<6-digit step>.tokens.json`` beside the episodes' ``step_<6-digit step>.jsonl``, for the batch
rows whose episode is one of the ``log.rollouts_n`` saved there. One JSON object::

    {"schema": 1, "step", "image_token_id", "pad_token_id", "eos_token_ids",
     "pieces": {"<id>": "<decoded text of that one id>", ...},   # every id that occurs below
     "fields": ["logprobs", "advantages", ...],                  # the per-token float arrays present
     "rows": [{"row", "episode", "traj_id", "group_id", "row_turn", "truncated", "bootstrap_index",
               "n_images", "length",
               "input_ids": [L ints], "loss_mask": [L 0/1], "turn_index": [L ints, -1 off the mask],
               "sample_logprobs": [L], <each of "fields">: [L]}]}

``L`` is the row's real length (padding is not written); ``episode`` indexes the episodes of the
step's JSONL; ``row`` is the row's index in the trained batch. The float arrays are float32 values
written in their shortest decimal form, so they read back bit-exact (:func:`read_token_rows`):

- ``sample_logprobs``: the sampling-time log-probs (``TokenBatch.old_logprobs``);
- ``logprobs``: log pi_old from the training forward pass (the PPO ratio's denominator);
- ``advantages``: the advantages the policy loss used (PPO: whitened when ``ppo.whiten_advantages``);
- ``values`` (PPO): V before each sampled token; ``returns`` (PPO): the critic's targets;
- ``entropy`` only if a recipe passes it (neither does: the per-token entropy exists only inside
  the update's gradient pass, and the dump adds no forward pass).

Rows the batch does not hold (errored episodes; GRPO groups dropped by ``grpo.filter``) are absent.
Size cap: once ``rollouts/`` holds more than ``log.rollouts_max_mb``, the file is a stub
``{"schema": 1, "step", "skipped": "..."}`` (as frames stop in ``vagent.runs.samples``).
In a job of several processes only rank 0 writes. Reading tensors is all this does: it changes
no number and draws no random number of the run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import torch
from torch import Tensor

from vagent.runs.samples import folder_bytes

if TYPE_CHECKING:
    from vagent.runconfig import LogConfig
    from vagent.rollout.batch import TokenBatch
    from vagent.models.processor import ChatEncoder

SCHEMA = 1
FLOAT_FIELDS = ("logprobs", "advantages", "values", "returns", "entropy")


def token_dump_path(folder: str | Path, step: int) -> Path:
    return Path(folder) / f"step_{step:06d}.tokens.json"


def _floats(x: np.ndarray) -> list[float | None]:
    """float32 values as short decimals (9 significant digits) that read back to the same float32;
    None where a value is not finite. Vectorized: a row of thousands of tokens takes microseconds."""
    a = x.astype(np.float32)
    v = a.astype(np.float64)
    finite = np.isfinite(v)
    mag = np.where(finite & (v != 0), np.abs(v), 1.0)
    scale = 10.0 ** (8 - np.floor(np.log10(mag)))
    short = np.round(v * scale) / scale
    short = np.where(finite & (short.astype(np.float32) == a), short, v)  # exact fallback, never lossy
    out = short.tolist()
    if not finite.all():
        for i in np.flatnonzero(~finite):
            out[i] = None
    return out


def _pieces(encoder: ChatEncoder, ids: set[int]) -> dict[str, str]:
    tok = encoder.tokenizer
    return {str(i): tok.decode([i], skip_special_tokens=False) for i in sorted(ids)}


def dump_rows(batch: TokenBatch, episodes: range | list[int], arrays: Mapping[str, Tensor | None]) -> list[dict]:
    """The row records of the batch rows whose ``episode_index`` is in ``episodes``.

    arrays: name -> [B, L] tensor (or None: left out), aligned with ``batch.input_ids``.
    """
    keep = set(episodes)
    for name, v in arrays.items():
        if v is not None and tuple(v.shape) != tuple(batch.input_ids.shape):
            raise ValueError(f"token dump: {name} has shape {tuple(v.shape)}, the batch's rows are "
                             f"{tuple(batch.input_ids.shape)}; pass the [B, L] tensor aligned with batch.input_ids")
    cpu = {k: v.detach().float().cpu().numpy() for k, v in arrays.items() if v is not None}
    ids, mask = batch.input_ids.cpu().numpy(), batch.loss_mask.cpu().numpy()
    turn, lengths = batch.turn_index.cpu().numpy(), batch.lengths.cpu().numpy()
    sample_lp = batch.old_logprobs.float().cpu().numpy()
    rows = []
    for b in range(batch.batch_size):
        e = int(batch.episode_index[b])
        if e not in keep:
            continue
        n = int(lengths[b])
        rec = {
            "row": b, "episode": e, "traj_id": int(batch.traj_ids[b]), "group_id": int(batch.group_ids[b]),
            "row_turn": int(batch.row_turn[b]), "truncated": bool(batch.truncated[b]),
            "bootstrap_index": int(batch.bootstrap_index[b]), "n_images": int(batch.n_images[b]), "length": n,
            "input_ids": ids[b, :n].tolist(), "loss_mask": mask[b, :n].astype(int).tolist(),
            "turn_index": turn[b, :n].tolist(), "sample_logprobs": _floats(sample_lp[b, :n]),
        }
        for name, a in cpu.items():
            rec[name] = _floats(a[b, :n])
        rows.append(rec)
    return rows


def save_token_rows(folder: str | Path, step: int, log: LogConfig, batch: TokenBatch, encoder: ChatEncoder, *,
                    logprobs: Tensor,
                    advantages: Tensor, values: Tensor | None = None, returns: Tensor | None = None,
                    entropy: Tensor | None = None) -> Path | None:
    """Write ``step_<6-digit step>.tokens.json`` (see the module docstring) for the first
    ``log.rollouts_n`` episodes, or a stub naming ``log.rollouts_max_mb`` when ``folder`` is full;
    returns its path, or None on ranks other than 0. The caller decides the schedule.

    batch: the trained ``TokenBatch`` (B rows, L positions); logprobs, advantages, values, returns,
    entropy: [B, L] aligned with ``batch.input_ids``; encoder: the policy's ``ChatEncoder``.
    """
    from vagent.distributed import world

    if not world().is_main:
        return None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = token_dump_path(folder, step)
    if folder_bytes(folder) >= int(log.rollouts_max_mb * 1024 * 1024):
        note = f"rollouts/ holds more than log.rollouts_max_mb={log.rollouts_max_mb} MB; raise it to keep token dumps"
        path.write_text(json.dumps({"schema": SCHEMA, "step": step, "skipped": note}))
        return path
    arrays = {"logprobs": logprobs, "advantages": advantages, "values": values, "returns": returns,
              "entropy": entropy}
    rows = dump_rows(batch, range(log.rollouts_n), arrays)
    doc = {
        "schema": SCHEMA, "step": step, "image_token_id": getattr(encoder, "image_token_id", None),
        "pad_token_id": int(encoder.pad_token_id), "eos_token_ids": [int(i) for i in encoder.eos_token_ids],
        "pieces": _pieces(encoder, {i for r in rows for i in r["input_ids"]}),
        "fields": [k for k in FLOAT_FIELDS if arrays[k] is not None], "rows": rows,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")))
    tmp.replace(path)
    return path


def read_token_rows(path: str | Path) -> dict:
    """The dump as written (``skipped`` set for a size-capped stub); raises naming the file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable token dump ({exc}); was it written by vagent.runs.tokens?") from exc
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: token dump schema {doc.get('schema')!r}, this vagent reads {SCHEMA}")
    return doc


def rows_as_tensors(doc: Mapping[str, Any]) -> dict[str, Tensor]:
    """The dump's rows padded back into [R, L] tensors (R dumped rows, L their longest), as in a
    ``TokenBatch``: input_ids (pad_token_id), loss_mask (bool), turn_index (-1), float32 arrays (0)."""
    rows = doc["rows"]
    R, L = len(rows), max((r["length"] for r in rows), default=0)
    out = {"input_ids": torch.full((R, L), int(doc["pad_token_id"]), dtype=torch.long),
           "loss_mask": torch.zeros(R, L, dtype=torch.bool), "turn_index": torch.full((R, L), -1, dtype=torch.long)}
    for name in ("sample_logprobs", *doc["fields"]):
        out[name] = torch.zeros(R, L, dtype=torch.float32)
    for i, r in enumerate(rows):
        n = r["length"]
        out["input_ids"][i, :n] = torch.tensor(r["input_ids"], dtype=torch.long)
        out["loss_mask"][i, :n] = torch.tensor(r["loss_mask"], dtype=torch.bool)
        out["turn_index"][i, :n] = torch.tensor(r["turn_index"], dtype=torch.long)
        for name in ("sample_logprobs", *doc["fields"]):
            out[name][i, :n] = torch.tensor([math.nan if v is None else v for v in r[name]], dtype=torch.float32)
    return out


__all__ = ["save_token_rows", "read_token_rows", "rows_as_tensors", "dump_rows", "token_dump_path", "FLOAT_FIELDS"]
