"""The on-disk episode store of an evaluation run: one JSON file per finished episode.

Layout under the run's ``out_dir``::

    episodes/<model>/<env>/<format>/<seed>_<sample>.json      the episode record (schema below)
    episodes/<model>/<env>/<format>/<seed>_<sample>/t<k>_<i>.png   image i of turn k's observation
    episodes/<model>/<env>/<format>/<seed>_<sample>/final_<i>.png  images of the final observation

Durability: images are written first, then the JSON through a temporary file that is flushed,
``fsync``-ed and renamed over the final name (``os.replace`` is atomic), then the directory is
``fsync``-ed. The JSON file is the completion marker: it exists only for a finished episode, and a
rerun skips exactly those. A process killed at any instant leaves either no file or a complete
one (plus, at worst, an orphan ``.tmp`` file and images that the rerun overwrites).

Record schema (``schema: 1``)::

    {"schema", "key": {"model", "env", "format", "seed", "sample"}, "run_config": {...},
     "fingerprint", "backend", "model_id", "env_name", "env_config", "mode", "system_prompt",
     "success", "env_return", "total_reward", "n_turns", "n_format_ok", "format_accuracy",
     "terminated", "truncated", "error", "usage": {"prompt_tokens", "completion_tokens",
     "retries", "reported_turns"}, "reasoning_scores": {judge: mean score over judged turns},
     "turns": [{"index", "observation": {"text", "images": [path], "n_images"}, "reply", "parsed": {...},
                "env_reward", "reward", "reasoning_rewards", "reasoning_scores", "judge_reasons", "terminated",
                "truncated", "info", "state_before", "state_after", "finish_reason", "usage"}],
     "final_observation": {"text", "images", "n_images"} | null,
     "samples": [[{"role", "text", "images": [path], "n_images"}]],   # the conversations sent to the model
     "finished_at"}

Image paths are relative to ``out_dir`` (empty lists when ``save_images`` is off; ``n_images``
still counts them). ``samples`` holds one conversation (concat mode) or one
per turn (no_concat / window).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from vagent.runs.rundir import write_atomic

SCHEMA = 1


class StoreError(ValueError):
    """An episode file that is not a valid record (edited or truncated by hand); the message names it."""


@dataclass(frozen=True, order=True)
class EpisodeKey:
    """Which episode: model label, env label, format, seed, sample index within the seed's group."""

    model: str
    env: str
    format: str
    seed: int
    sample: int = 0

    @property
    def stem(self) -> str:
        return f"episodes/{self.model}/{self.env}/{self.format}/{self.seed}_{self.sample}"

    @property
    def json_path(self) -> str:
        return self.stem + ".json"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def plain(x: object) -> Any:
    """A JSON-safe copy of a state/info value (numpy arrays and scalars, tuples, sets, dataclasses)."""
    if isinstance(x, Mapping):
        return {str(k): plain(v) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return repr(x)


def fingerprint(run_config: Mapping[str, Any]) -> str:
    """sha256 (first 16 hex digits) of the canonical JSON of what determines an episode."""
    blob = json.dumps(plain(run_config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably, creating its folder: tmp file, fsync, rename,
    fsync dir (:func:`vagent.runs.rundir.write_atomic`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def atomic_write_json(path: Path, obj: object) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, ensure_ascii=False).encode("utf-8"))


def _save_png(out_dir: Path, rel: str, image: Any) -> None:
    p = out_dir / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    image.save(p, format="PNG")


def _mean(xs: list[float]) -> float | None:
    return float(sum(xs) / len(xs)) if xs else None


def _turn_record(t: Any, images: list[str]) -> dict[str, Any]:
    """The JSON record of one ``Turn``; ``images`` are its observation's saved PNG paths."""
    return {
        "index": t.index,
        "observation": {"text": t.observation.text, "images": images, "n_images": len(t.observation.images)},
        "reply": t.reply,
        "parsed": plain(t.parsed),
        "env_reward": t.env_reward, "reward": t.reward,
        "reasoning_rewards": plain(t.reasoning_rewards), "reasoning_scores": plain(t.reasoning_scores),
        "judge_reasons": plain(t.judge_reasons),
        "terminated": t.terminated, "truncated": t.truncated,
        "info": plain(t.info), "state_before": plain(t.state_before), "state_after": plain(t.state_after),
        "finish_reason": t.finish_reason, "usage": plain(t.usage),
    }


def _usage_totals(turns: Sequence[Any]) -> dict[str, int]:
    """Token counts summed over the turns whose backend reported them, and retries over all turns."""
    reported = [t.usage for t in turns if "prompt_tokens" in t.usage]
    return {
        "prompt_tokens": sum(int(u.get("prompt_tokens", 0)) for u in reported),
        "completion_tokens": sum(int(u.get("completion_tokens", 0)) for u in reported),
        "retries": sum(int(t.usage.get("retries", 0)) for t in turns),
        "reported_turns": len(reported),
    }


def _mean_reasoning_scores(turns: Sequence[Any]) -> dict[str, float | None]:
    """Each judge's mean score over the turns it scored."""
    judged: dict[str, list[float]] = {}
    for t in turns:
        for name, score in t.reasoning_scores.items():
            judged.setdefault(name, []).append(float(score))
    return {k: _mean(v) for k, v in judged.items()}


class _ImageSaver:
    """Saves an episode's images as ``<stem>/<prefix>_<i>.png`` once each, remembering each image's path."""

    def __init__(self, out_dir: Path, stem: str, enabled: bool) -> None:
        self.out_dir, self.stem, self.enabled = out_dir, stem, enabled
        self.paths: dict[int, str] = {}

    def save(self, images: Iterable[Any], prefix: str) -> list[str]:
        """Save ``images`` (if saving is on) and return their paths relative to the output folder."""
        rels: list[str] = []
        if not self.enabled:
            return rels
        for i, im in enumerate(images):
            rel = f"{self.stem}/{prefix}_{i}.png"
            _save_png(self.out_dir, rel, im)
            self.paths[id(im)] = rel
            rels.append(rel)
        return rels

    def message_images(self, images: Sequence[Any]) -> list[str]:
        """The saved paths of a message's images (observation images, saved already)."""
        rels = []
        for im in images if self.enabled else ():
            if id(im) not in self.paths:  # an image that is no observation (should not happen)
                self.save([im], f"extra{len(self.paths)}")
            rels.append(self.paths[id(im)])
        return rels


def episode_record(episode: Any, key: EpisodeKey, meta: Mapping[str, Any], out_dir: Path,
                   save_images: bool = True) -> dict[str, Any]:
    """The JSON record of a finished ``Episode`` (schema in the module docstring); writes its PNGs.

    ``meta`` holds ``run_config``, ``fingerprint``, ``backend``, ``model_id`` and ``mode``.
    """
    saver = _ImageSaver(out_dir, key.stem, save_images)
    turns = [_turn_record(t, saver.save(t.observation.images, f"t{t.index}")) for t in episode.turns]
    final = None
    if episode.final_observation is not None:
        fo = episode.final_observation
        final = {"text": fo.text, "images": saver.save(fo.images, "final"), "n_images": len(fo.images)}
    samples = [[{"role": m.role, "text": m.text, "images": saver.message_images(m.images), "n_images": len(m.images)}
                for m in conv.messages] for conv in episode.samples]
    n_ok = sum(bool(t.parsed.format_ok) for t in episode.turns)
    return {
        "schema": SCHEMA,
        "key": key.as_dict(),
        **{k: meta[k] for k in ("run_config", "fingerprint", "backend", "model_id", "mode")},
        "env_name": episode.env_name,
        "env_config": plain(episode.env_config),
        "system_prompt": episode.system_prompt,
        "success": bool(episode.success),
        "env_return": float(episode.env_return),
        "total_reward": float(episode.total_reward),
        "n_turns": len(episode.turns),
        "n_format_ok": n_ok,
        "format_accuracy": n_ok / len(episode.turns) if episode.turns else None,
        "terminated": bool(episode.terminated),
        "truncated": bool(episode.truncated),
        "error": episode.error,
        "usage": _usage_totals(episode.turns),
        "reasoning_scores": _mean_reasoning_scores(episode.turns),
        "turns": turns,
        "final_observation": final,
        "samples": samples,
        "finished_at": time.time(),
    }


def write_episode(out_dir: Path, record: Mapping[str, Any]) -> Path:
    """Atomically write a record to its key's JSON path (images must already be on disk)."""
    key = EpisodeKey(**record["key"])
    path = out_dir / key.json_path
    atomic_write_json(path, record)
    return path


def read_episode(out_dir: Path, key: EpisodeKey) -> dict[str, Any] | None:
    """The record of ``key`` if its JSON exists and parses; None if it does not exist.

    A file that exists but does not parse (impossible with atomic writes unless edited by hand)
    raises :class:`StoreError` naming the file.
    """
    path = out_dir / key.json_path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreError(f"{path} is not valid JSON ({exc}); delete it to rerun that episode.") from exc
    if rec.get("schema") != SCHEMA or rec.get("key") != key.as_dict():
        raise StoreError(f"{path} is not an episode record of schema {SCHEMA} for {key}; delete it to rerun it.")
    return rec


__all__ = ["EpisodeKey", "SCHEMA", "StoreError", "plain", "fingerprint", "atomic_write_bytes", "atomic_write_json",
           "episode_record", "write_episode", "read_episode"]
