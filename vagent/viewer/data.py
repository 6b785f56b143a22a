"""What the viewer shows, read from a run directory or an evaluation directory.

Both kinds of directory become the same three documents (plain JSON, built on demand):

- ``index()``: the groups (a run's dumped RL steps ``step_<6-digit step>`` and saved validation
  points ``val_<6-digit step>``; an evaluation's (model, env, format) cells) with success /
  return / format rates, the run's every RL step and validation point
  (``metrics.jsonl``), and which training columns exist;
- ``episodes(group)``: one short summary per episode of a group (what filters and sorting need);
- ``episode(group, i)``: one episode as turns: image paths, prompt, reply, reward parts, and,
  where the run dumped tokens (``vagent.runs.tokens``), its token rows split per turn.

Token rows are split into turns by the loss mask alone: a turn's reply is the run of mask-1
tokens whose ``turn_index`` is that turn; its prompt is the mask-0 tokens since the previous
reply in the same row (the previous reply's closing template, the observation, the generation
prompt); what follows the last reply of a row (closing template, a truncated episode's final
observation) is the row's ``after``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from vagent.runs.tokens import read_token_rows


class ViewerError(ValueError):
    """A path that is neither a run directory nor an evaluation directory, or a bad request."""


def open_source(path: str | Path) -> "RunSource | EvalSource":
    """The source for ``path``: a run directory (``rollouts/``, ``metrics.jsonl``) or an evaluation
    directory (``summary.json``, ``episodes/``)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ViewerError(f"vagent view {str(root)!r}: no such directory. Pass a run directory (runs/<name>-<time>) "
                          "or an evaluation directory (the eval config's out_dir).")
    if (root / "episodes").is_dir() or _has_cells(root / "summary.json"):  # a run's summary.json has no cells
        return EvalSource(root)
    if (root / "rollouts").is_dir() or (root / "metrics.jsonl").is_file():
        return RunSource(root)
    raise ViewerError(f"vagent view {str(root)!r}: neither a run directory (no rollouts/ or metrics.jsonl) nor an "
                      "evaluation directory (no summary.json or episodes/).")


def _has_cells(path: Path) -> bool:
    try:
        return path.is_file() and "cells" in json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False


# ---------------------------------------------------------------------- turns and rewards
def _judge_parts(turn: Mapping[str, Any]) -> list[dict]:
    """Each judged field's score, reward and why the reward is what it is (``vagent.rewards``)."""
    out = []
    scores, rewards = turn.get("reasoning_scores") or {}, turn.get("reasoning_rewards") or {}
    for kind in sorted(set(scores) | set(rewards)):
        s, r = scores.get(kind), rewards.get(kind, 0.0)
        if r < 0:
            why = (f"anti-hacking penalty {r:+.3f}: a frequent description that scored {s:.3f}, below the "
                   "threshold, gets the penalty instead of weight x score")
        elif s and r == 0:
            why = f"rule checks failed (missing entities or too long): the score {s:.3f} was set to 0"
        else:
            why = f"weight x score = {r:+.3f}" if s is not None else "reward without a score"
        recorded = (turn.get("judge_reasons") or {}).get(kind)  # the judge's own reason (runs that record it)
        out.append({"kind": kind, "score": s, "reward": r, "reason": recorded or why})
    return out


@lru_cache(maxsize=64)
def _format_amount(env_name: str, config_json: str) -> float | None:
    """The ``format`` reward term of a built-in env with this config (``env.rewards["format"]``),
    None for other envs or a config that no longer builds (the page then shows it inside env)."""
    from vagent.envs.registry import list_envs, make

    if env_name not in list_envs(builtin_only=True):
        return None
    try:
        env = make(env_name, **json.loads(config_json))
    except Exception:  # noqa: BLE001 - display only: an old run's config may not build any more
        return None
    try:
        amount = (getattr(env, "rewards", None) or {}).get("format")
    finally:
        getattr(env, "close", lambda: None)()
    return float(amount) if amount is not None else None


def _format_reward(turn: Mapping[str, Any], env_name: str, env_config: Mapping[str, Any]) -> float | None:
    """The format bonus inside ``env_reward`` (``vagent.envs.formats.format_reward``): the env's
    format amount when the format was right and an action ran; None when the amount is unknown."""
    amount = _format_amount(env_name or "", json.dumps(env_config, sort_keys=True))
    if amount is None:
        return None
    info = turn.get("info") or {}
    ran = info.get("n_valid_actions", 1)
    return amount if turn.get("format_ok", (turn.get("parsed") or {}).get("format_ok")) and ran else 0.0


def turn_view(turn: Mapping[str, Any], env_name: str, env_config: Mapping[str, Any], images: list[str],
              prompt: str) -> dict:
    parsed = turn.get("parsed") or {}
    fmt = _format_reward(turn, env_name, env_config)
    env_r = float(turn.get("env_reward", 0.0))
    judge = _judge_parts(turn)
    return {
        "index": turn["index"], "images": images, "prompt": prompt, "reply": turn.get("reply", ""),
        "format_ok": bool(turn.get("format_ok", parsed.get("format_ok"))), "format_error": parsed.get("error"),
        "actions": parsed.get("actions") or [], "finish_reason": turn.get("finish_reason"),
        "reward": float(turn.get("reward", 0.0)),
        "reward_parts": {"env": env_r - (fmt or 0.0), "format": fmt, "judge": sum(j["reward"] for j in judge)},
        "judge": judge, "info": turn.get("info") or {}, "tokens": None,
    }


def _penalized(turn: Mapping[str, Any]) -> int:
    """Judged fields of a turn whose reward is a penalty or a zeroed score (as _judge_parts says)."""
    scores = turn.get("reasoning_scores") or {}
    return sum(r < 0 or (bool(scores.get(k)) and r == 0) for k, r in (turn.get("reasoning_rewards") or {}).items())


def _summary(i: int, rec: Mapping[str, Any], turns: list[Mapping[str, Any]]) -> dict:
    n_fmt = sum(not t.get("format_ok", (t.get("parsed") or {}).get("format_ok", False)) for t in turns)
    return {
        "i": i, "env": rec.get("env_name"), "seed": rec.get("seed", (rec.get("key") or {}).get("seed")),
        "sample": (rec.get("key") or {}).get("sample", rec.get("traj_id")),
        "success": bool(rec.get("success")), "total_reward": rec.get("total_reward"),
        "env_return": rec.get("env_return"), "n_turns": len(turns), "format_errors": n_fmt,
        "judge_penalties": sum(_penalized(t) for t in turns),
        "error": rec.get("error"), "max_abs_adv": None, "has_tokens": False,
        "first_reply": (turns[0].get("reply", "") if turns else "")[:160],
    }


# ---------------------------------------------------------------------- token rows -> turns
def split_row(row: Mapping[str, Any]) -> tuple[dict[int, dict], list[int]]:
    """{turn: {"ctx": [start, end), "reply": [start, end)}} of one dumped row, and its ``after``
    span [start, end) (see the module docstring)."""
    mask, turn = row["loss_mask"], row["turn_index"]
    n, spans, prev_end, p = len(mask), {}, 0, 0
    while p < n:
        if not mask[p]:
            p += 1
            continue
        k, start = turn[p], p
        while p < n and mask[p] and turn[p] == k:
            p += 1
        spans[k] = {"ctx": [prev_end, start], "reply": [start, p]}
        prev_end = p
    return spans, [prev_end, n]


def _row_payload(row: Mapping[str, Any], fields: list[str]) -> dict:
    out = {"row": row["row"], "ids": row["input_ids"], "mask": row["loss_mask"], "slp": row["sample_logprobs"],
           "truncated": row["truncated"], "bootstrap_index": row["bootstrap_index"]}
    for name in fields:
        out[name] = row[name]
    return out


def attach_tokens(turns: list[dict], rows: list[Mapping[str, Any]], doc: Mapping[str, Any]) -> dict:
    """Put each turn's token span on it (in place); returns the episode's token payload."""
    payload_rows, after = [], []
    for r, row in enumerate(rows):
        spans, tail = split_row(row)
        for k, span in spans.items():
            if 0 <= k < len(turns):
                turns[k]["tokens"] = {"row": r, **span, "n_loss": span["reply"][1] - span["reply"][0]}
        if tail[1] > tail[0]:
            after.append({"row": r, "span": tail})
        payload_rows.append(_row_payload(row, doc["fields"]))
    ids = {i for row in rows for i in row["input_ids"]}
    return {"rows": payload_rows, "after": after, "fields": doc["fields"],
            "pieces": {str(i): doc["pieces"].get(str(i), f"<{i}>") for i in ids},
            "image_token_id": doc.get("image_token_id"),
            "n_loss": sum(sum(row["loss_mask"]) for row in rows)}


def _max_abs_adv(rows: list[Mapping[str, Any]]) -> float | None:
    vals = [abs(a) for row in rows for a, m in zip(row.get("advantages") or [], row["loss_mask"])
            if m and a is not None]
    return max(vals) if vals else None


# ---------------------------------------------------------------------- run directories
class RunSource:
    """A training run directory (``vagent.runs.rundir``): groups are the RL steps with dumps
    (``step_<6-digit step>``) and the validation points with saved episodes (``val_<6-digit step>``)."""

    kind = "run"

    def __init__(self, root: Path):
        self.root = root
        self.rollouts = root / "rollouts"
        self._steps = self._dumped("step")
        self._vals = self._dumped("val")
        self._load = lru_cache(maxsize=8)(self._load_step)  # (prefix, step) -> records, dump, rows
        self.episodes = lru_cache(maxsize=8)(self.episodes)  # type: ignore[method-assign]

    def _dumped(self, prefix: str) -> list[int]:
        """The steps of ``rollouts/<prefix>_<6-digit step>.jsonl`` files (prefix: step or val)."""
        if not self.rollouts.is_dir():
            return []
        n = len(prefix) + 1
        return sorted(int(p.name[n:n + 6]) for p in self.rollouts.glob(f"{prefix}_??????.jsonl"))

    def _metrics(self) -> list[dict]:
        path = self.root / "metrics.jsonl"
        if not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written right now
                continue
        return out

    def index(self) -> dict:
        rl = [m for m in self._metrics() if m.get("phase", "rl") == "rl"]
        steps: dict[int, dict] = {}
        val = []
        for m in rl:
            if "val/success_rate" in m:
                val.append({"step": m["step"], "success": m.get("val/success_rate"), "return": m.get("val/return"),
                            "format": m.get("val/format_accuracy"), "turns": m.get("val/turns")})
            if "rollout/success_rate" in m or "reward/mean" in m:
                steps[m["step"]] = {
                    "step": m["step"], "success": m.get("rollout/success_rate"),
                    "return": m.get("rollout/return_mean", m.get("reward/mean")),
                    "format": m.get("rollout/format_accuracy"), "loss_policy": m.get("loss/policy"),
                    "explained_variance": m.get("critic/explained_variance"),
                }
        groups = []
        for s in self._steps:
            groups.append({"id": f"step_{s:06d}", "label": f"step {s}", "split": "train", "step": s,
                           **steps.get(s, {}), "tokens": self._token_status(s)})
        val_at = {v["step"]: v for v in val}
        for s in self._vals:
            groups.append({"id": f"val_{s:06d}", "label": f"validation @ step {s}", "split": "val", "step": s,
                           **{k: v for k, v in val_at.get(s, {}).items() if k != "step"}, "tokens": "no (not trained)"})
        return {"kind": "run", "title": self.root.name, "path": str(self.root), "groups": groups,
                "steps": [steps[k] for k in sorted(steps)], "val": val, "training": True}

    def _token_status(self, step: int) -> str:
        """yes / no / the size cap's note, without reading a whole dump (a stub is a few hundred bytes)."""
        path = self.rollouts / f"step_{step:06d}.tokens.json"
        if not path.is_file():
            return "no"
        return "yes" if path.stat().st_size > 4096 else (read_token_rows(path).get("skipped") and "skipped (size cap)"
                                                           or "yes")

    def _token_doc(self, step: int) -> dict | None:
        path = self.rollouts / f"step_{step:06d}.tokens.json"
        return read_token_rows(path) if path.is_file() else None

    def _group_of(self, group: str) -> tuple[str, int]:
        """("step" | "val", step) of a group id such as step_000010 or val_000010."""
        prefix, _, digits = group.partition("_")
        if prefix not in ("step", "val") or not (len(digits) == 6 and digits.isdigit()):
            raise ViewerError(f"unknown group {group!r}: expected step_ or val_ and a 6-digit step, e.g. step_000010")
        step = int(digits)
        dumped = self._steps if prefix == "step" else self._vals
        if step not in dumped:
            what = "rollouts dumped" if prefix == "step" else "validation episodes saved"
            raise ViewerError(f"no {what} at step {step} (saved: {dumped[:20]})")
        return prefix, step

    def _load_step(self, prefix: str, step: int) -> tuple[list[dict], dict | None, dict[int, list[dict]]]:
        """(episode records, token dump or None, the dump's rows by episode) of a group."""
        lines = (self.rollouts / f"{prefix}_{step:06d}.jsonl").read_text().splitlines()
        doc = self._token_doc(step) if prefix == "step" else None
        by_episode: dict[int, list[dict]] = {}
        for r in (doc or {}).get("rows", []):
            by_episode.setdefault(r["episode"], []).append(r)
        return [json.loads(x) for x in lines if x.strip()], doc, by_episode

    def episodes(self, group: str) -> list[dict]:
        recs, _, rows_of = self._load(*self._group_of(group))
        out = []
        for i, rec in enumerate(recs):
            s = _summary(i, rec, rec["turns"])
            rows = rows_of.get(i, [])
            s["has_tokens"], s["max_abs_adv"] = bool(rows), _max_abs_adv(rows)
            out.append(s)
        return out

    def episode(self, group: str, i: int) -> dict:
        prefix, step = self._group_of(group)
        recs, doc, rows_of = self._load(prefix, step)
        if not 0 <= i < len(recs):
            raise ViewerError(f"{group}: episode {i} out of range (0..{len(recs) - 1})")
        rec = recs[i]
        cfg = rec.get("env_config") or {}
        turns = [turn_view(t, rec.get("env_name"), cfg, [f"rollouts/{f}" for f in t.get("frames") or []],
                           t.get("observation", "")) for t in rec["turns"]]
        rows = rows_of.get(i, [])
        tokens = attach_tokens(turns, rows, doc) if rows else None
        why = None
        if prefix == "val":
            why = "validation episodes are played greedily and not trained, so they have no token rows"
        elif tokens is None:
            why = (doc or {}).get("skipped") or ("no token dump for this step (a run from before token dumps, or "
                                                 "log.rollouts_every off)" if doc is None else
                                                 "no token rows: the episode failed or its GRPO group was filtered out")
        summary = {**_summary(i, rec, rec["turns"]), "has_tokens": bool(rows), "max_abs_adv": _max_abs_adv(rows)}
        return {"group": group, "i": i, **summary, "env_config": cfg,
                "terminated": rec.get("terminated"), "truncated": rec.get("truncated"),
                "final_images": [f"rollouts/{f}" for f in rec.get("final_frames") or []],
                "turns": turns, "token_data": tokens, "no_tokens_reason": why,
                "frames_skipped": rec.get("frames_skipped", False)}

    def file(self, rel: str) -> Path:
        return _safe_file(self.root, rel)


# ---------------------------------------------------------------------- evaluation directories
class EvalSource:
    """An evaluation directory (``vagent.eval.store``): groups are its (model, env, format) cells."""

    kind = "eval"

    def __init__(self, root: Path):
        self.root = root
        summary = root / "summary.json"
        self.summary = json.loads(summary.read_text()) if summary.is_file() else {"cells": []}
        self._cells = {}
        for d in sorted((root / "episodes").glob("*/*/*")) if (root / "episodes").is_dir() else []:
            if d.is_dir():
                model, env, fmt = d.relative_to(root / "episodes").parts
                self._cells[f"{model}/{env}/{fmt}"] = d
        self._load = lru_cache(maxsize=8)(self._load_cell)

    def index(self) -> dict:
        rows = {f"{c['model']}/{c['env']}/{c['format']}": c for c in self.summary.get("cells", [])}
        groups = []
        for gid in self._cells:
            c = rows.get(gid, {})
            groups.append({"id": gid, "label": gid, "success": c.get("success_rate"), "return": c.get("mean_return"),
                           "format": c.get("format_accuracy"), "episodes": c.get("finished"), "tokens": "no"})
        return {"kind": "eval", "title": self.root.name, "path": str(self.root), "groups": groups, "steps": [],
                "val": [], "training": False}

    def _load_cell(self, group: str) -> list[dict]:
        if group not in self._cells:
            raise ViewerError(f"unknown cell {group!r}; cells: {sorted(self._cells)[:20]}")
        recs = [json.loads(p.read_text()) for p in self._cells[group].glob("*.json")]
        return sorted(recs, key=lambda r: (r["key"]["seed"], r["key"]["sample"]))

    def episodes(self, group: str) -> list[dict]:
        return [_summary(i, r, r["turns"]) for i, r in enumerate(self._load(group))]

    def episode(self, group: str, i: int) -> dict:
        recs = self._load(group)
        if not 0 <= i < len(recs):
            raise ViewerError(f"{group}: episode {i} out of range (0..{len(recs) - 1})")
        rec = recs[i]
        cfg = rec.get("env_config") or {}
        turns = []
        for t in rec["turns"]:
            obs = t.get("observation") or {}
            prompt = (rec.get("system_prompt", "") + "\n\n" if t["index"] == 0 else "") + obs.get("text", "")
            fmt_ok = (t.get("parsed") or {}).get("format_ok")
            turns.append(turn_view({**t, "format_ok": fmt_ok}, rec.get("env_name"), cfg, list(obs.get("images") or []),
                                   prompt))
        final = rec.get("final_observation") or {}
        return {"group": group, "i": i, **_summary(i, rec, rec["turns"]), "env_config": cfg,
                "terminated": rec.get("terminated"), "truncated": rec.get("truncated"),
                "final_images": list(final.get("images") or []), "turns": turns, "token_data": None,
                "no_tokens_reason": "evaluation records hold no tokens", "frames_skipped": False}

    def file(self, rel: str) -> Path:
        return _safe_file(self.root, rel)


def _safe_file(root: Path, rel: str) -> Path:
    """``root / rel`` if it is a file inside ``root`` (no ``..`` escapes), else ViewerError."""
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()) or not path.is_file():
        raise ViewerError(f"no such file in {root}: {rel!r}")
    return path


__all__ = ["ViewerError", "RunSource", "EvalSource", "open_source", "split_row", "attach_tokens", "turn_view"]
