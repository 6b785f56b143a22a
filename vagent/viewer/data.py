"""What the viewer shows, read from a run directory or an evaluation directory.

Both kinds of directory become the same three documents (plain JSON, built on demand):

- ``index()``: the groups (a run's dumped RL steps ``step_<6-digit step>`` and saved validation
  points ``val_<6-digit step>``; an evaluation's (model, env, format) cells) with success /
  return / format rates, the run's every RL step and validation point
  (``metrics.jsonl``), and which training columns exist;
- ``episodes(group)``: one short summary per episode of a group (what filters and sorting need);
- ``episode(group, i)``: one episode as turns: image paths, prompt, reply, reward parts, and,
  where the run dumped tokens (``vagent.runs.tokens``), its token rows split per turn
  (:mod:`vagent.viewer.turns`).

Files are read and checked by :mod:`vagent.viewer.files` (a bad file is :class:`BadFile` naming the
file, line and field); grid envs' symbols are explained by :mod:`vagent.viewer.legend`.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Literal

from vagent.runs.tokens import read_token_rows
from vagent.viewer.files import (  # noqa: F401 -- the checks stay importable from here
    BadFile, ViewerError, _guarded, _parse, _read_lines, _safe_file, check_record, check_token_doc,
)
from vagent.viewer.legend import env_legend
from vagent.viewer.turns import (
    attach_tokens, episode_summary, finite_number, max_abs_advantage, turn_view,
)

#: token dumps bigger than this are not read (``--max-token-mb``): a 200 MB dump takes 23 s and
#: 0.8 GB to parse, for one episode's rows (bench/viewer.py, docs/results.md)
MAX_TOKEN_MB = 64.0


def open_source(path: str | Path, max_token_mb: float = MAX_TOKEN_MB) -> "RunSource | EvalSource":
    """The source for ``path``: a run directory (``rollouts/``, ``metrics.jsonl``) or an evaluation
    directory (``summary.json``, ``episodes/``). max_token_mb: see :class:`RunSource`."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ViewerError(f"vagent view {str(root)!r}: no such directory. Pass a run directory (runs/<name>-<time>) "
                          "or an evaluation directory (the eval config's out_dir).")
    if (root / "episodes").is_dir() or _has_cells(root / "summary.json"):  # a run's summary.json has no cells
        return EvalSource(root)
    if (root / "rollouts").is_dir() or (root / "metrics.jsonl").is_file():
        return RunSource(root, max_token_mb)
    raise ViewerError(f"vagent view {str(root)!r}: neither a run directory (no rollouts/ or metrics.jsonl) nor an "
                      "evaluation directory (no summary.json or episodes/).")


def _has_cells(path: Path) -> bool:
    try:
        return path.is_file() and "cells" in json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False


# ---------------------------------------------------------------------- run directories
class RunSource:
    """A training run directory (``vagent.runs.rundir``): groups are the RL steps with dumps
    (``step_<6-digit step>``) and the validation points with saved episodes (``val_<6-digit step>``).

    max_token_mb: token dumps bigger than this are not read; their episodes show text, images and
    rewards with a note naming the size (``vagent view --max-token-mb``).
    """

    kind: Literal["run"] = "run"

    def __init__(self, root: Path, max_token_mb: float = MAX_TOKEN_MB):
        self.root = root
        self.rollouts = root / "rollouts"
        self.max_token_mb = float(max_token_mb)
        self._steps = self._dumped("step")
        self._vals = self._dumped("val")
        self._load = lru_cache(maxsize=8)(self._load_step)  # (prefix, step) -> records, dump, rows
        self.episodes = lru_cache(maxsize=8)(self.episodes)  # type: ignore[method-assign]

    def _dumped(self, prefix: str) -> list[int]:
        """The steps of ``rollouts/<prefix>_<6-digit step>.jsonl`` files (prefix: step or val); other
        files there (``step_latest.jsonl``, a copy) are not the run's and are left alone."""
        if not self.rollouts.is_dir():
            return []
        n = len(prefix) + 1
        names = (p.name[n:n + 6] for p in self.rollouts.glob(f"{prefix}_??????.jsonl") if p.is_file())
        return sorted(int(d) for d in names if d.isdigit() and d.isascii())

    def _metrics(self) -> list[dict]:
        """The records of ``metrics.jsonl`` (read again when the file changed); a last line without its
        newline (being written) is left out, any other line that is not a JSON object with an integer
        ``step`` is BadFile."""
        path = self.root / "metrics.jsonl"
        if not path.is_file():
            return []
        st = path.stat()
        key = (st.st_mtime_ns, st.st_size)
        if getattr(self, "_metrics_key", None) != key:
            self._metrics_records, self._metrics_key = self._read_metrics(path), key
        return self._metrics_records

    @staticmethod
    def _read_metrics(path: Path) -> list[dict]:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines()
        if lines and not text.endswith("\n"):
            lines.pop()  # a line being written right now
        out = []
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            rec = _parse(line, f"metrics.jsonl line {n}")
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or isinstance(rec["step"], bool):
                raise BadFile(f"metrics.jsonl line {n}: expected a JSON object with an integer 'step', found "
                              f"{line[:80]!r}")
            out.append(rec)
        return out

    def index(self) -> dict:
        rl = [m for m in self._metrics() if m.get("phase", "rl") == "rl"]
        steps: dict[int, dict] = {}
        updated: dict[int, bool] = {}
        val = []
        for m in rl:
            if "actor/updated" in m and finite_number(m["actor/updated"]) is not None:
                updated[m["step"]] = bool(m["actor/updated"])
            if "val/success_rate" in m:
                val.append({"step": m["step"], **{k: finite_number(m.get(f"val/{name}")) for k, name in (
                    ("success", "success_rate"), ("return", "return"), ("format", "format_accuracy"),
                    ("turns", "turns"))}})
            if "rollout/success_rate" in m or "reward/mean" in m:
                steps[m["step"]] = {
                    "step": m["step"], "success": finite_number(m.get("rollout/success_rate")),
                    "return": finite_number(m.get("rollout/return_mean", m.get("reward/mean"))),
                    "format": finite_number(m.get("rollout/format_accuracy")),
                    "loss_policy": finite_number(m.get("loss/policy")),
                    "explained_variance": finite_number(m.get("critic/explained_variance")),
                    # the engine/trainer gap (overlap 1: behaviour vs proximal) and the weight-push canary
                    "mismatch_kl": finite_number(m.get("mismatch/kl", m.get("mismatch/behaviour_proximal_kl"))),
                    "canary_gap": finite_number(m.get("sync/canary_max_abs_diff")),
                }
        for s, row in steps.items():
            row["actor_updated"] = updated.get(s)
        groups = []
        for s in self._steps:
            groups.append({"id": f"step_{s:06d}", "label": f"step {s}", "split": "train", "step": s,
                           **steps.get(s, {}), "actor_updated": updated.get(s), "tokens": self._token_status(s)})
        val_at = {v["step"]: v for v in val}
        for s in self._vals:
            groups.append({"id": f"val_{s:06d}", "label": f"validation @ step {s}", "split": "val", "step": s,
                           **{k: v for k, v in val_at.get(s, {}).items() if k != "step"}, "tokens": "no (not trained)"})
        return {"kind": "run", "title": self.root.name, "path": str(self.root), "groups": groups,
                "steps": [steps[k] for k in sorted(steps)], "val": val, "training": True}

    def _actor_updated(self, step: int) -> bool | None:
        """Whether the actor was updated at ``step`` (``actor/updated`` of metrics.jsonl; PPO's critic
        warm-up logs 0); None when the run does not log it (GRPO always updates the actor)."""
        flags = [bool(m["actor/updated"]) for m in self._metrics()
                 if m["step"] == step and m.get("phase", "rl") == "rl"
                 and finite_number(m.get("actor/updated")) is not None]
        return flags[-1] if flags else None

    def _token_path(self, step: int) -> Path:
        return self.rollouts / f"step_{step:06d}.tokens.json"

    def _too_big(self, path: Path) -> str | None:
        """Why the token dump at ``path`` is not read (bigger than max_token_mb), or None."""
        mb = path.stat().st_size / 1e6
        if mb <= self.max_token_mb:
            return None
        return (f"the token dump {path.name} is {mb:.0f} MB, more than this viewer reads "
                f"({self.max_token_mb:g} MB); run vagent view with --max-token-mb {math.ceil(mb)} to read it "
                "(it takes several times its size in memory and seconds per 10 MB), or lower log.rollouts_n in "
                "the run")

    def _token_status(self, step: int) -> str:
        """yes / no / the size cap's note, without reading a whole dump (a stub is a few hundred bytes)."""
        path = self._token_path(step)
        if not path.is_file():
            return "no"
        if self._too_big(path):
            return f"not read ({path.stat().st_size / 1e6:.0f} MB, over --max-token-mb)"
        if path.stat().st_size > 4096:
            return "yes"
        doc = self._token_doc(step)
        return "skipped (size cap)" if doc and doc.get("skipped") else "yes"

    def _token_doc(self, step: int) -> dict | None:
        path = self._token_path(step)
        if not path.is_file() or self._too_big(path):
            return None
        rel = f"rollouts/{path.name}"
        try:
            doc = read_token_rows(path)
        except RecursionError:
            raise BadFile(f"{rel}: JSON nested deeper than this viewer reads") from None
        except ValueError as exc:
            raise BadFile(str(exc).replace(str(path), rel)) from None
        if not doc.get("skipped"):
            check_token_doc(doc, rel)
        return doc

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

    def _load_step(self, prefix: str, step: int) -> tuple[list[tuple[str, dict]], dict | None, dict[int, list[dict]]]:
        """((where, record) of each episode, token dump or None, the dump's rows by episode) of a group;
        ``where`` names the record's file and line for error messages."""
        rel = f"rollouts/{prefix}_{step:06d}.jsonl"
        recs = []
        for n, rec in _read_lines(self.rollouts / f"{prefix}_{step:06d}.jsonl", rel):
            check_record(rec, f"{rel} line {n}")
            recs.append((f"{rel} line {n}", rec))
        doc = self._token_doc(step) if prefix == "step" else None
        by_episode: dict[int, list[dict]] = {}
        for r in (doc or {}).get("rows", []):
            by_episode.setdefault(r["episode"], []).append(r)
        return recs, doc, by_episode

    def episodes(self, group: str) -> list[dict]:
        recs, _, rows_of = self._load(*self._group_of(group))
        out = []
        for i, (where, rec) in enumerate(recs):
            s = _guarded(where, lambda: episode_summary(i, rec, rec["turns"]))
            rows = rows_of.get(i, [])
            s["has_tokens"], s["max_abs_adv"] = bool(rows), max_abs_advantage(rows)
            out.append(s)
        return out

    def episode(self, group: str, i: int) -> dict:
        prefix, step = self._group_of(group)
        recs, doc, rows_of = self._load(prefix, step)
        if not 0 <= i < len(recs):
            raise ViewerError(f"{group}: episode {i} out of range (0..{len(recs) - 1})")
        where, rec = recs[i]
        rows = rows_of.get(i, [])
        return _guarded(where, lambda: self._episode(group, i, prefix, step, rec, doc, rows))

    def _episode(self, group: str, i: int, prefix: str, step: int, rec: dict, doc: dict | None,
                 rows: list[dict]) -> dict:
        cfg = rec.get("env_config") or {}
        turns = [turn_view(t, rec.get("env_name"), cfg, [f"rollouts/{f}" for f in t.get("frames") or []],
                           t.get("observation") or "", t.get("observation")) for t in rec["turns"]]
        tokens = attach_tokens(turns, rows, doc) if rows else None
        why = None
        path = self._token_path(step)
        if prefix == "val":
            why = "validation episodes are played greedily and not trained, so they have no token rows"
        elif tokens is None and path.is_file() and self._too_big(path):
            why = self._too_big(path)
        elif tokens is None:
            why = (doc or {}).get("skipped") or ("no token dump for this step (a run from before token dumps, or "
                                                 "log.rollouts_every off)" if doc is None else
                                                 "no token rows: the episode failed or its GRPO group was filtered out")
        summary = {**episode_summary(i, rec, rec["turns"]), "has_tokens": bool(rows),
                   "max_abs_adv": max_abs_advantage(rows)}
        return {"group": group, "i": i, **summary, "env_config": cfg,
                "terminated": rec.get("terminated"), "truncated": rec.get("truncated"),
                "final_images": [f"rollouts/{f}" for f in rec.get("final_frames") or []],
                "turns": turns, "token_data": tokens, "no_tokens_reason": why,
                "actor_updated": self._actor_updated(step) if prefix == "step" else None,
                "legend": env_legend(rec.get("env_name") or ""),
                "frames_skipped": rec.get("frames_skipped", False)}

    def file(self, rel: str) -> Path:
        return _safe_file(self.root, rel)


# ---------------------------------------------------------------------- evaluation directories
class EvalSource:
    """An evaluation directory (``vagent.eval.store``): groups are its (model, env, format) cells."""

    kind: Literal["eval"] = "eval"

    def __init__(self, root: Path):
        self.root = root
        summary = root / "summary.json"
        self.summary = _parse(summary.read_text(encoding="utf-8", errors="replace"), "summary.json") \
            if summary.is_file() else {"cells": []}
        if not isinstance(self.summary, dict) or not isinstance(self.summary.get("cells", []), list) or not all(
                isinstance(c, dict) for c in self.summary.get("cells", [])):
            raise BadFile("summary.json: expected a JSON object whose 'cells' is a list of objects")
        self._cells = {}
        for d in sorted((root / "episodes").glob("*/*/*")) if (root / "episodes").is_dir() else []:
            if d.is_dir():
                model, env, fmt = d.relative_to(root / "episodes").parts
                self._cells[f"{model}/{env}/{fmt}"] = d
        self._load = lru_cache(maxsize=8)(self._load_cell)

    def index(self) -> dict:
        rows = {f"{c.get('model')}/{c.get('env')}/{c.get('format')}": c for c in self.summary.get("cells", [])}
        groups = []
        for gid in self._cells:
            c = rows.get(gid, {})
            groups.append({"id": gid, "label": gid, "success": finite_number(c.get("success_rate")),
                           "return": finite_number(c.get("mean_return")),
                           "format": finite_number(c.get("format_accuracy")),
                           "episodes": finite_number(c.get("finished")), "tokens": "no"})
        return {"kind": "eval", "title": self.root.name, "path": str(self.root), "groups": groups, "steps": [],
                "val": [], "training": False}

    def _load_cell(self, group: str) -> list[tuple[str, dict]]:
        """(where, record) of the cell's episodes, in (seed, sample) order; BadFile names a bad file."""
        if group not in self._cells:
            raise ViewerError(f"unknown cell {group!r}; cells: {sorted(self._cells)[:20]}")
        recs = []
        for p in self._cells[group].glob("*.json"):
            where = str(p.relative_to(self.root))
            rec = _parse(p.read_text(encoding="utf-8", errors="replace"), where)
            if not isinstance(rec, dict):
                raise BadFile(f"{where}: a {type(rec).__name__}, expected a JSON object (an episode record)")
            check_record(rec, where, kind="eval")
            recs.append((where, rec))
        return sorted(recs, key=lambda wr: (wr[1]["key"]["seed"], wr[1]["key"]["sample"]))

    def episodes(self, group: str) -> list[dict]:
        return [_guarded(w, lambda: episode_summary(i, r, r["turns"])) for i, (w, r) in enumerate(self._load(group))]

    def episode(self, group: str, i: int) -> dict:
        recs = self._load(group)
        if not 0 <= i < len(recs):
            raise ViewerError(f"{group}: episode {i} out of range (0..{len(recs) - 1})")
        where, rec = recs[i]
        return _guarded(where, lambda: self._episode(group, i, rec))

    def _episode(self, group: str, i: int, rec: dict) -> dict:
        cfg = rec.get("env_config") or {}
        turns = []
        for t in rec["turns"]:
            obs = t.get("observation") or {}
            text = obs.get("text") or ""
            prompt = ((rec.get("system_prompt") or "") + "\n\n" if t["index"] == 0 else "") + text
            fmt_ok = (t.get("parsed") or {}).get("format_ok")
            turns.append(turn_view({**t, "format_ok": fmt_ok}, rec.get("env_name"), cfg, list(obs.get("images") or []),
                                   prompt, text))
        final = rec.get("final_observation") or {}
        return {"group": group, "i": i, **episode_summary(i, rec, rec["turns"]), "env_config": cfg,
                "terminated": rec.get("terminated"), "truncated": rec.get("truncated"),
                "final_images": list(final.get("images") or []), "turns": turns, "token_data": None,
                "no_tokens_reason": "evaluation records hold no tokens", "actor_updated": None,
                "legend": env_legend(rec.get("env_name") or ""),
                "frames_skipped": False}

    def file(self, rel: str) -> Path:
        return _safe_file(self.root, rel)


__all__ = ["ViewerError", "BadFile", "RunSource", "EvalSource", "open_source", "check_record", "check_token_doc",
           "env_legend", "MAX_TOKEN_MB"]
