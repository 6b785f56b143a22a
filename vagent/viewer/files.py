"""Reading a run's or an evaluation's files defensively: the viewer's errors, JSON that names the
file and line it came from, and the checks that an episode record or a token dump holds the types
the viewer shows (a bad file is an HTTP 422 naming the file, line and field, never a traceback).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Mapping


class ViewerError(ValueError):
    """A path that is neither a run directory nor an evaluation directory, or a bad request (HTTP 404)."""

    status = 404


class BadFile(ViewerError):
    """A file of the directory that the viewer cannot read: its message names the file and line (HTTP 422)."""

    status = 422


def _no_constant(name: str) -> None:
    """NaN / Infinity in a file read as null (the page shows a dash)."""
    return None


def _parse(text: str, where: str) -> Any:
    """``text`` as JSON, or BadFile naming ``where`` (a nesting too deep for Python included)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise BadFile(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise BadFile(f"{where}: JSON nested deeper than this viewer reads "
                      f"(Python's recursion limit {sys.getrecursionlimit()})") from None


def _read_lines(path: Path, rel: str) -> list[tuple[int, dict]]:
    """(line number, object) of each non-empty line of a JSONL file; BadFile names the line."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if line.strip():
            rec = _parse(line, f"{rel} line {n}")
            if not isinstance(rec, dict):
                raise BadFile(f"{rel} line {n}: a {type(rec).__name__}, expected a JSON object")
            out.append((n, rec))
    return out


_NONE = type(None)
_NUM = (int, float, _NONE)
_STR = (str, _NONE)

#: the types of what the viewer reads from an episode record, a turn and a turn's ``parsed``
RECORD_TYPES = {"turns": (list,), "env_name": _STR, "seed": (int, _NONE), "key": (dict, _NONE),
                "success": (bool, int, _NONE), "total_reward": _NUM, "env_return": _NUM, "error": _STR,
                "env_config": (dict, _NONE), "final_frames": (list, _NONE), "terminated": (bool, _NONE),
                "truncated": (bool, _NONE), "frames_skipped": (bool, _NONE), "system_prompt": _STR,
                "final_observation": (dict, _NONE)}
TURN_TYPES = {"index": (int,), "reply": _STR, "reward": _NUM, "env_reward": _NUM, "format_ok": (bool, _NONE),
              "parsed": (dict, _NONE), "info": (dict, _NONE), "frames": (list, _NONE), "finish_reason": _STR,
              "reasoning_scores": (dict, _NONE), "reasoning_rewards": (dict, _NONE), "judge_reasons": (dict, _NONE),
              "weights_version": (int, _NONE), "token_versions": (list, _NONE)}
PARSED_TYPES = {"actions": (list, _NONE), "error": _STR, "format_ok": (bool, _NONE)}


def _check_types(obj: Mapping[str, Any], types: Mapping[str, tuple], where: str, required: tuple = ()) -> None:
    for key in required:
        if key not in obj:
            raise BadFile(f"{where}: no {key!r} (expected keys: {', '.join(types)})")
    for key, ok in types.items():
        if key in obj and not isinstance(obj[key], ok):
            names = " or ".join("null" if t is _NONE else t.__name__ for t in ok)
            found = f"{json.dumps(obj[key])[:60]} ({type(obj[key]).__name__})"
            raise BadFile(f"{where}: {key!r} is {found}, expected {names}")


def _check_list(items: Any, ok: tuple, where: str) -> None:
    bad = next((x for x in items if not isinstance(x, ok)), _check_list)
    if bad is not _check_list:
        names = " or ".join("null" if t is _NONE else t.__name__ for t in ok)
        raise BadFile(f"{where}: holds {json.dumps(bad)[:60]}, expected a list of {names}")


def check_record(rec: Mapping[str, Any], where: str, kind: str = "run") -> None:
    """BadFile (naming ``where`` and the field) unless ``rec`` is an episode record the viewer can show:
    the fields it reads have the types a run (``vagent.runs.samples``) or an evaluation writes."""
    _check_types(rec, RECORD_TYPES, where, required=("turns",) + (("key",) if kind == "eval" else ()))
    if kind == "eval":
        _check_types(rec["key"], {"seed": (int,), "sample": (int,)}, f"{where}: key", required=("seed", "sample"))
    _check_list(rec.get("final_frames") or [], (str,), f"{where}: final_frames")
    _check_list(rec.get("turns"), (dict,), f"{where}: turns")
    for k, t in enumerate(rec["turns"]):
        at = f"{where}: turns[{k}]"
        observation = (dict, _NONE) if kind == "eval" else _STR
        _check_types(t, {**TURN_TYPES, "observation": observation}, at, required=("index",))
        _check_types(t.get("parsed") or {}, PARSED_TYPES, f"{at}.parsed")
        _check_list((t.get("parsed") or {}).get("actions") or [], (str,), f"{at}.parsed.actions")
        _check_list(t.get("frames") or [], (str,), f"{at}.frames")
        _check_list((t.get("reasoning_rewards") or {}).values(), (int, float), f"{at}.reasoning_rewards")
        _check_list((t.get("reasoning_scores") or {}).values(), _NUM, f"{at}.reasoning_scores")
        _check_list((t.get("judge_reasons") or {}).values(), _STR, f"{at}.judge_reasons")
        if kind == "eval":
            obs = t.get("observation") or {}
            _check_types(obs, {"text": _STR, "images": (list, _NONE)}, f"{at}.observation")
            _check_list(obs.get("images") or [], (str,), f"{at}.observation.images")
    if kind == "eval":
        final = rec.get("final_observation") or {}
        _check_list(final.get("images") or [], (str,), f"{where}: final_observation.images")


ROW_INTS = ("row", "episode", "bootstrap_index")
ROW_ARRAYS = ("input_ids", "loss_mask", "turn_index", "sample_logprobs")


def check_token_doc(doc: Any, rel: str) -> None:
    """BadFile (naming the file and row) unless ``doc`` is a token dump the viewer can split into turns:
    every row's arrays as long as its ``input_ids``, ids and turn indices integers, the mask 0/1."""
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise BadFile(f"{rel}: not a token dump (expected a JSON object with a 'rows' list)")
    _check_types(doc, {"fields": (list,), "pieces": (dict,), "image_token_id": (int, _NONE)}, rel,
                 required=("fields", "pieces"))
    _check_list(doc["fields"], (str,), f"{rel}: fields")
    for r, row in enumerate(doc["rows"]):
        at = f"{rel}: rows[{r}]"
        if not isinstance(row, dict):
            raise BadFile(f"{at}: a {type(row).__name__}, expected a JSON object")
        arrays = ROW_ARRAYS + tuple(doc["fields"])
        _check_types(row, {**{k: (int,) for k in ROW_INTS}, "truncated": (bool,), **{k: (list,) for k in arrays}}, at,
                     required=ROW_INTS + arrays)
        n = len(row["input_ids"])
        for name in arrays[1:]:
            if len(row[name]) != n:
                raise BadFile(f"{at}: {name} has {len(row[name])} entries, input_ids {n}; every array of a row "
                              "holds one entry per token")
        _check_list(row["input_ids"], (int,), f"{at}.input_ids")
        _check_list(row["turn_index"], (int,), f"{at}.turn_index")
        if any(m not in (0, 1) for m in row["loss_mask"]):
            raise BadFile(f"{at}.loss_mask: entries other than 0 and 1")
        for name in arrays[3:]:
            _check_list(row[name], _NUM, f"{at}.{name}")


def _guarded(where: str, build: Callable[[], Any]) -> Any:
    """``build()``; an error from an odd value that the checks above let through becomes BadFile naming ``where``."""
    try:
        return build()
    except ViewerError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
        raise BadFile(f"{where}: cannot show this record ({type(exc).__name__}: {exc})") from None


def _safe_file(root: Path, rel: str) -> Path:
    """``root / rel`` if it is a file inside ``root`` (no ``..`` escapes), else ViewerError."""
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()) or not path.is_file():
        raise ViewerError(f"no such file in {root}: {rel!r}")
    return path
