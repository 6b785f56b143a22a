"""Saving sampled rollouts for reading: ``rollouts/step_<6-digit step>.jsonl`` plus PNG frames,
and the validation episodes: ``rollouts/val_<6-digit step>.jsonl`` (:func:`save_validation`).

One JSON object per episode::

    {"env_name", "env_config", "seed", "group_id", "traj_id", "success", "total_reward",
     "env_return", "terminated", "truncated", "error",
     "turns": [{"index", "observation", "frames": ["step_000010/e0_t0_0.png", ...], "reply",
                "parsed": {"observation", "reasoning", "prediction", "answer", "actions", "error"},
                "format_ok", "state_before", "state_after", "reward", "env_reward",
                "reasoning_rewards", "reasoning_scores", "judge_reasons", "info", "finish_reason",
                "n_sampled_tokens"}],
     "final_frames": [...]}

Frame paths are relative to the ``rollouts/`` folder (``step_<6-digit step>/e<episode>_t<turn>_<image>.png``,
``..._final_<image>.png`` for the observation after the last step; ``val_<6-digit step>/...`` for
validation). The folder is size-capped
(``log.rollouts_max_mb``): once it holds more than the cap, frames are no longer written (the
JSONL still is, with ``"frames_skipped": true``) so a long run cannot fill the disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np


def _plain(x: object) -> Any:
    """JSON-safe copy of a state/info value (numpy arrays and scalars, tuples, sets)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def episode_record(ep: Any, frames: list[list[str]] | None = None, final_frames: list[str] | None = None) -> dict:
    """The JSON record of one :class:`vagent.rollout.records.Episode`."""
    turns = []
    for i, t in enumerate(ep.turns):
        p = t.parsed
        turns.append({
            "index": t.index,
            "observation": t.observation.text,
            "frames": frames[i] if frames else [],
            "reply": t.reply,
            "parsed": {"observation": p.observation, "reasoning": p.reasoning, "prediction": p.prediction,
                       "think": p.think, "answer": p.answer, "actions": list(p.actions), "error": p.error},
            "format_ok": bool(p.format_ok),
            "state_before": _plain(t.state_before),
            "state_after": _plain(t.state_after),
            "reward": float(t.reward),
            "env_reward": float(t.env_reward),
            "reasoning_rewards": _plain(t.reasoning_rewards),
            "reasoning_scores": _plain(t.reasoning_scores),
            "judge_reasons": _plain(t.judge_reasons),
            "info": _plain(t.info),
            "finish_reason": t.finish_reason,
            "n_sampled_tokens": len(t.sampled_token_ids),
            "weights_version": t.weights_version,  # the reply's first token's (all of them, unless split)
            "token_versions": getattr(t, "token_versions", None),  # per token when a push split the reply
        })
    return {
        "env_name": ep.env_name, "env_config": _plain(ep.env_config), "seed": ep.seed,
        "group_id": ep.group_id, "traj_id": ep.traj_id, "success": bool(ep.success),
        "total_reward": ep.total_reward, "env_return": ep.env_return, "terminated": bool(ep.terminated),
        "truncated": bool(ep.truncated), "error": ep.error, "turns": turns,
        "final_frames": final_frames or [],
    }


def _write_episodes(folder: Path, name: str, episodes: Sequence[Any], max_mb: float) -> Path:
    """``<folder>/<name>.jsonl`` (one record per episode) and its frames under ``<folder>/<name>/``,
    frames left out once ``folder`` holds more than ``max_mb`` (see the module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    cap = int(max_mb * 1024 * 1024)
    used = folder_bytes(folder)
    lines = []
    for e, ep in enumerate(episodes):
        skip = used >= cap
        frames: list[list[str]] = []
        final: list[str] = []
        if not skip:
            (folder / name).mkdir(exist_ok=True)
            for t in ep.turns:
                names = []
                for j, im in enumerate(t.observation.images):
                    rel = f"{name}/e{e}_t{t.index}_{j}.png"
                    im.save(folder / rel)
                    used += (folder / rel).stat().st_size
                    names.append(rel)
                frames.append(names)
            if ep.final_observation is not None:
                for j, im in enumerate(ep.final_observation.images):
                    rel = f"{name}/e{e}_final_{j}.png"
                    im.save(folder / rel)
                    used += (folder / rel).stat().st_size
                    final.append(rel)
        rec = episode_record(ep, frames or None, final)
        rec["frames_skipped"] = skip
        line = json.dumps(rec)
        used += len(line) + 1
        lines.append(line)
    out = folder / f"{name}.jsonl"
    out.write_text("".join(line + "\n" for line in lines))
    return out


def save_rollouts(folder: str | Path, step: int, episodes: Sequence[Any], n: int, max_mb: float) -> Path:
    """Write the first ``n`` episodes of a step; returns the JSONL path."""
    return _write_episodes(Path(folder), f"step_{step:06d}", list(episodes)[:n], max_mb)


def save_validation(folder: str | Path, step: int, episodes: Sequence[Any], max_mb: float) -> Path | None:
    """Write every episode of the validation at ``step`` (RL steps completed) as
    ``val_<6-digit step>.jsonl`` with its frames under ``val_<6-digit step>/`` (the same records
    and size cap as :func:`save_rollouts`); returns the path, or None on a rank other than 0.

    Validation plays the same val-split seeds at every validation point, so two points' files
    hold the same boards: ``vagent view`` pairs them by (env, seed)."""
    from vagent.distributed import world

    if not world().is_main:
        return None
    return _write_episodes(Path(folder), f"val_{step:06d}", list(episodes), max_mb)
