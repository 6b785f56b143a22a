"""An episode record's turns as the viewer shows them: each turn's reward parts (env, format,
reasoning judges), a summary per episode, and a run's token rows split into turns.

Token rows are split into turns by the loss mask alone: a turn's reply is the run of mask-1
tokens whose ``turn_index`` is that turn; its prompt is the mask-0 tokens since the previous
reply in the same row (the previous reply's closing template, the observation, the generation
prompt); what follows the last reply of a row (closing template, a truncated episode's final
observation) is the row's ``after``. The directories these come from are read by
:mod:`vagent.viewer.data`.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any, Mapping

__all__ = ["attach_tokens", "episode_summary", "finite_number", "max_abs_advantage", "split_row", "turn_view"]


def finite_number(x: object) -> float | None:
    """``x`` if it is a finite number (not a bool), else None: what a rate or loss column shows."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return x
    return None


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
              prompt: str, observation: str | None = None) -> dict:
    """One turn as the page shows it; ``observation``: the observation's text (shown in full when the
    turn has no image: a text env's board is there, not in the collapsed prompt)."""
    parsed = turn.get("parsed") or {}
    fmt = _format_reward(turn, env_name, env_config)
    env_r = finite_number(turn.get("env_reward")) or 0.0
    judge = _judge_parts(turn)
    return {
        "index": turn["index"], "images": images, "prompt": prompt, "observation": observation,
        "reply": turn.get("reply") or "",
        "format_ok": bool(turn.get("format_ok", parsed.get("format_ok"))), "format_error": parsed.get("error"),
        "actions": parsed.get("actions") or [], "finish_reason": turn.get("finish_reason"),
        "reward": finite_number(turn.get("reward")),
        "reward_parts": {"env": env_r - (fmt or 0.0), "format": fmt, "judge": sum(j["reward"] for j in judge)},
        "judge": judge, "info": turn.get("info") or {}, "tokens": None,
        "weights_version": turn.get("weights_version"),
        "token_versions": turn.get("token_versions"),
    }


def _penalized(turn: Mapping[str, Any]) -> int:
    """Judged fields of a turn whose reward is a penalty or a zeroed score (as _judge_parts says)."""
    scores = turn.get("reasoning_scores") or {}
    return sum(r < 0 or (bool(scores.get(k)) and r == 0) for k, r in (turn.get("reasoning_rewards") or {}).items())


def episode_summary(i: int, rec: Mapping[str, Any], turns: list[Mapping[str, Any]]) -> dict:
    n_fmt = sum(not t.get("format_ok", (t.get("parsed") or {}).get("format_ok", False)) for t in turns)
    return {
        "i": i, "env": rec.get("env_name"), "seed": rec.get("seed", (rec.get("key") or {}).get("seed")),
        "sample": (rec.get("key") or {}).get("sample", rec.get("traj_id")),
        "success": bool(rec.get("success")), "total_reward": rec.get("total_reward"),
        "env_return": rec.get("env_return"), "n_turns": len(turns), "format_errors": n_fmt,
        "judge_penalties": sum(_penalized(t) for t in turns),
        "error": rec.get("error"), "max_abs_adv": None, "has_tokens": False,
        "first_reply": ((turns[0].get("reply") if turns else None) or "")[:160],
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


def max_abs_advantage(rows: list[Mapping[str, Any]]) -> float | None:
    vals = [abs(a) for row in rows for a, m in zip(row.get("advantages") or [], row["loss_mask"])
            if m and a is not None]
    return max(vals) if vals else None
