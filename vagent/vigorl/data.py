"""ViGoRL datasets: JSONL examples, the synthetic visual-search generator, scoring and geometry.

JSONL format (one example per line; docs/algorithms.md reference section 10)::

    {"image": "images/000123.png",          # path relative to the JSONL file
     "question": "Where is the red circle? ...",
     "bbox": [x1, y1, x2, y2]}               # grounding: ORIGINAL-image pixels, inclusive
    {"image": "...", "question": "What colour is the shape at {point}?", "point": [x, y],
     "answer": "red"}                        # a text answer

Exactly one of ``answer`` (text) and ``bbox`` (grounding) is required. Optional keys: ``id``;
``point`` (original pixels) with a ``{point}`` placeholder in the question, written as ``(x, y)``
in the coordinates the model sees; ``split`` (train / val / test: an env then draws an episode
seed's example from that split only, see :func:`example_for_seed`); ``description`` (the scene as
text, for ``render="text"``); ``shapes`` (a synthetic scene, written by ``make-data``); ``meta``
(anything, ignored). :func:`load_dataset` raises :class:`DatasetError` naming the file, the line,
what was expected and the fix.

Accuracy (:func:`score_answer`): a text answer matches after :func:`normalize_answer`
(lowercase, collapsed spaces, no surrounding punctuation, no leading "the "); a grounding answer
``(x, y)`` (pixels of the shown image) is mapped back to the original image
(:func:`to_original`) and scores 1 when it lies inside the bbox (inclusive), as ViGoRL's
``point_in_bbox``.

Geometry (shown <-> original pixels, zoom crops) and the records (:class:`Shape`, :class:`Example`)
are :mod:`vagent.vigorl.scene`, re-exported here.

Synthetic visual search (:func:`generate_example`): a ``canvas_size`` square canvas with 3-6
non-overlapping shapes, each a distinct (colour, kind) pair, from ``numpy.random.default_rng(seed)``
only (a seed fully determines the example in any process). Questions: "where" ("Where is the red
circle?", a bbox answer) or "colour" ("What colour is the shape at {point}?", a text answer).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from vagent.jsonl import read_records
from vagent.vigorl.grounding import Point, format_point, parse_point_answer
from vagent.vigorl.scene import (  # noqa: F401 -- the records and the geometry stay importable from here
    BACKGROUND, DOT_COLOUR, KINDS, PAD_COLOUR, PALETTE, Example, Shape, describe_scene, display_size,
    render_scene, resize_for_display, to_display, to_original, zoom_crop,
)

TASKS = ("mixed", "where", "colour")
SPLIT_NAMES = ("train", "val", "test")
_KEYS = ("id", "image", "question", "answer", "bbox", "point", "split", "description", "shapes", "meta")


class DatasetError(ValueError):
    """A dataset file or record does not follow the documented format (the message says the fix)."""


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------

def normalize_answer(text: str) -> str:
    """Lowercase, collapse whitespace, strip surrounding punctuation and a leading "the "."""
    t = re.sub(r"\s+", " ", str(text).strip().lower())
    t = t.strip(" .,;:!?\"'`")
    return t[4:] if t.startswith("the ") else t


def answer_point(example: Example, answer: str, shown: Sequence[int]) -> Point | None:
    """The original-pixel point of a grounding answer ``(x, y)`` in shown pixels; None if the
    answer is not a point inside the shown image."""
    p = parse_point_answer(answer)
    if p is None or not (0 <= p[0] < shown[0] and 0 <= p[1] < shown[1]):
        return None
    return to_original(p, shown, example.size)


def score_answer(example: Example, answer: str, shown: Sequence[int]) -> float:
    """Accuracy in {0, 1} of ``answer`` (see the module docstring); ``shown`` = the shown size."""
    if example.bbox is not None:
        p = answer_point(example, answer, shown)
        if p is None:
            return 0.0
        x1, y1, x2, y2 = example.bbox
        return 1.0 if x1 <= p[0] <= x2 and y1 <= p[1] <= y2 else 0.0
    return 1.0 if normalize_answer(answer) == normalize_answer(example.answer or "") else 0.0


def answer_is_well_formed(example: Example, answer: str, shown: Sequence[int]) -> bool:
    """A grounding answer must be a point inside the shown image; a text answer any non-empty text."""
    if example.bbox is not None:
        return answer_point(example, answer, shown) is not None
    return bool(str(answer).strip())


def reference_answer(example: Example, shown: Sequence[int]) -> str:
    """A correct answer in shown coordinates: the bbox centre as ``(x, y)``, or the text answer."""
    if example.bbox is not None:
        x1, y1, x2, y2 = example.bbox
        return format_point(to_display(((x1 + x2) // 2, (y1 + y2) // 2), example.size, shown))
    return str(example.answer)


def question_text(example: Example, shown: Sequence[int]) -> str:
    """The question with ``{point}`` written in shown coordinates."""
    if example.point is None:
        return example.question
    return example.question.replace("{point}", format_point(to_display(example.point, example.size, shown)))


# ---------------------------------------------------------------------------------------------
# Synthetic scenes
# ---------------------------------------------------------------------------------------------

def generate_scene(rng: np.random.Generator, canvas_size: int, n_min: int = 3, n_max: int = 6,
                   r_min: int | None = None, r_max: int | None = None) -> tuple[Shape, ...]:
    """``n_min..n_max`` shapes with distinct (colour, kind), boxes at least 6 px apart and 4 px
    from the border; half-sizes in ``[r_min, r_max]`` (default ~2.7% to 6.3% of the canvas)."""
    r_min = r_min if r_min is not None else max(3, round(canvas_size * 0.027))
    r_max = r_max if r_max is not None else max(r_min, round(canvas_size * 0.063))
    n = int(rng.integers(n_min, n_max + 1))
    pairs = [(c, k) for c in PALETTE for k in KINDS]
    order = rng.permutation(len(pairs))
    shapes: list[Shape] = []
    for idx in order:
        if len(shapes) == n:
            break
        colour, kind = pairs[int(idx)]
        for _ in range(200):
            r = int(rng.integers(r_min, r_max + 1))
            x = int(rng.integers(r + 4, canvas_size - r - 4))
            y = int(rng.integers(r + 4, canvas_size - r - 4))
            if all(abs(x - s.x) > r + s.r + 6 or abs(y - s.y) > r + s.r + 6 for s in shapes):
                shapes.append(Shape(kind, colour, x, y, r))
                break
    if len(shapes) < n_min:
        raise DatasetError(f"could not place {n_min} shapes on a {canvas_size} px canvas; use a larger canvas_size.")
    return tuple(shapes)


def generate_example(seed: int, canvas_size: int = 448, task: str = "mixed", n_min: int = 3,
                     n_max: int = 6) -> Example:
    """The synthetic example of ``seed`` (see the module docstring)."""
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"a synthetic example needs a seed >= 0, got {seed!r}")
    if task not in TASKS:
        raise DatasetError(f"unknown synthetic task {task!r}; valid: {', '.join(TASKS)}.")
    if canvas_size < 64:
        raise DatasetError(f"canvas_size must be >= 64 pixels, got {canvas_size}.")
    rng = np.random.default_rng(int(seed))
    shapes = generate_scene(rng, canvas_size, n_min, n_max)
    target = shapes[int(rng.integers(len(shapes)))]
    kind = task if task != "mixed" else ("where", "colour")[int(rng.integers(2))]
    size = (canvas_size, canvas_size)
    common = dict(id=f"synthetic-{int(seed)}", size=size, shapes=shapes, seed=int(seed),
                  description=describe_scene(shapes, size), meta={"target": target.to_dict(), "task": kind})
    if kind == "where":
        q = f"Where is the {target.name}? Answer with a point (x, y) inside it, in pixels of the image."
        return Example(question=q, bbox=target.bbox, **common)
    q = "What colour is the shape at {point}? Answer with one word."
    return Example(question=q, answer=target.colour, point=(target.x, target.y), **common)


def example_record(example: Example, image_rel: str) -> dict[str, Any]:
    """The JSONL record of an example whose image is saved at ``image_rel`` (relative path)."""
    rec: dict[str, Any] = {"id": example.id, "image": image_rel, "question": example.question}
    if example.bbox is not None:
        rec["bbox"] = list(example.bbox)
    else:
        rec["answer"] = example.answer
    if example.point is not None:
        rec["point"] = list(example.point)
    if example.split is not None:
        rec["split"] = example.split
    if example.description is not None:
        rec["description"] = example.description
    if example.shapes:
        rec["shapes"] = [s.to_dict() for s in example.shapes]
    rec["meta"] = {**example.meta, **({"seed": example.seed} if example.seed is not None else {})}
    return rec


def write_synthetic(out_dir: str | Path, n: int, first_seed: int = 0, canvas_size: int = 448,
                    task: str = "mixed") -> Path:
    """Write examples of seeds ``first_seed .. first_seed + n - 1`` as PNG + ``data.jsonl`` under
    ``out_dir``; each record's split is its seed's split (``vagent.seeds.split_of``)."""
    from dataclasses import replace

    from vagent.seeds import split_of

    if n < 1:
        raise DatasetError(f"--n must be >= 1, got {n}.")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for seed in range(first_seed, first_seed + n):
        ex = replace(generate_example(seed, canvas_size, task), split=split_of(seed))
        rel = f"images/{ex.id}.png"
        ex.load_image().save(out / rel)
        lines.append(json.dumps(example_record(ex, rel)))
    path = out / "data.jsonl"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def _int_list(value: Any, n: int, what: str, where: str) -> tuple[int, ...]:
    if (not isinstance(value, list) or len(value) != n
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise DatasetError(f"{where}: \"{what}\" must be a list of {n} integers, got {str(value)[:60]}.")
    return tuple(value)


def _image_size(path: Path, where: str) -> tuple[int, int]:
    try:
        with Image.open(path) as im:
            return im.size
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{where}: cannot read image {str(path)!r} ({exc}); is it a PNG/JPEG file?") from exc


def _shapes(value: Any, where: str) -> tuple[Shape, ...]:
    if not isinstance(value, list):
        raise DatasetError(f'{where}: "shapes" must be a list of {{"kind", "colour", "x", "y", "r"}} objects.')
    out = []
    for i, s in enumerate(value):
        try:
            shape = Shape(str(s["kind"]), str(s["colour"]), int(s["x"]), int(s["y"]), int(s["r"]))
        except (TypeError, KeyError, ValueError) as exc:
            raise DatasetError(f'{where}: shapes[{i}] must have kind, colour, x, y, r ({exc}).') from exc
        if shape.kind not in KINDS or shape.colour not in PALETTE:
            raise DatasetError(f"{where}: shapes[{i}] has kind {shape.kind!r} / colour {shape.colour!r}; "
                               f"valid kinds {', '.join(KINDS)}, colours {', '.join(PALETTE)}.")
        out.append(shape)
    return tuple(out)


def parse_record(rec: Any, base: Path, where: str) -> Example:
    """One JSONL record as an :class:`Example` (paths relative to ``base``); DatasetError if bad."""
    if not isinstance(rec, dict):
        raise DatasetError(f'{where}: expected a JSON object {{"image", "question", "answer" or "bbox"}}, '
                           f"got {type(rec).__name__}.")
    for k in rec:
        if k not in _KEYS:
            close = difflib.get_close_matches(str(k), _KEYS, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise DatasetError(f"{where}: unknown key {k!r}.{hint} Valid keys: {', '.join(_KEYS)}.")
    for k in ("image", "question"):
        if not isinstance(rec.get(k), str) or not rec[k].strip():
            raise DatasetError(f'{where}: "{k}" must be a non-empty string.')
    if ("answer" in rec) == ("bbox" in rec):
        raise DatasetError(f'{where}: give exactly one of "answer" (a text answer) and "bbox" '
                           "([x1, y1, x2, y2] in original pixels, for grounding).")
    image = base / rec["image"]
    if not image.is_file():
        raise DatasetError(f"{where}: image {rec['image']!r} not found (looked at {image}); "
                           "image paths are relative to the JSONL file.")
    size = _image_size(image, where)
    answer, bbox, point = None, None, None
    if "answer" in rec:
        if not isinstance(rec["answer"], str) or not rec["answer"].strip():
            raise DatasetError(f'{where}: "answer" must be a non-empty string.')
        answer = rec["answer"]
    else:
        bbox = _int_list(rec["bbox"], 4, "bbox", where)
        if not (0 <= bbox[0] <= bbox[2] < size[0] and 0 <= bbox[1] <= bbox[3] < size[1]):
            raise DatasetError(f"{where}: bbox {list(bbox)} must satisfy 0 <= x1 <= x2 < {size[0]} and "
                               f"0 <= y1 <= y2 < {size[1]} (original pixels of the {size[0]} x {size[1]} image).")
    if "point" in rec:
        point = _int_list(rec["point"], 2, "point", where)
        if not (0 <= point[0] < size[0] and 0 <= point[1] < size[1]):
            raise DatasetError(f"{where}: point {list(point)} is outside the {size[0]} x {size[1]} image.")
    if ("{point}" in rec["question"]) != (point is not None):
        raise DatasetError(f'{where}: a question with "{{point}}" needs "point": [x, y], and "point" needs '
                           '"{point}" in the question (it is written there in the coordinates the model sees).')
    split = rec.get("split")
    if split is not None and split not in SPLIT_NAMES:
        raise DatasetError(f"{where}: split {split!r} is not one of {', '.join(SPLIT_NAMES)}.")
    description = rec.get("description")
    if description is not None and not isinstance(description, str):
        raise DatasetError(f'{where}: "description" must be a string.')
    shapes = _shapes(rec["shapes"], where) if "shapes" in rec else ()
    return Example(id=str(rec.get("id", where)), question=rec["question"], size=size, answer=answer, bbox=bbox,
                   point=point, image_path=str(image), shapes=shapes, description=description, split=split,
                   meta=dict(rec.get("meta") or {}))


def load_dataset(path: str | Path) -> tuple[Example, ...]:
    """Read and validate a JSONL dataset (module docstring); cached per (path, mtime, size)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DatasetError(f"dataset {str(path)!r} does not exist. Write one with `vagent vigorl make-data DIR "
                           "--n 64` (then data: DIR/data.jsonl) or point `data` at a JSONL file.")
    st = os.stat(p)
    return _load_cached(str(p.resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int, size: int) -> tuple[Example, ...]:
    p = Path(path)
    out = [parse_record(rec, p.parent, where) for rec, where in read_records(p, DatasetError)]
    if not out:
        raise DatasetError(f"{p}: no examples in the file.")
    return tuple(out)


def example_for_seed(examples: Sequence[Example], seed: int, source: str = "dataset") -> Example:
    """The example of an episode seed. If any record has a ``split``, the pool is the records of
    the seed's split (``vagent.seeds.split_of``) and the index ``(seed - split start) % len(pool)``;
    otherwise ``seed % len(examples)`` over all records (then train and val seeds share examples:
    give the val/test envs their own file)."""
    from vagent.seeds import SPLITS, split_of

    if seed < 0:
        raise ValueError(f"seeds are >= 0, got {seed}")
    if any(e.split is not None for e in examples):
        split = split_of(seed)
        pool = [e for e in examples if e.split == split]
        if not pool:
            have = sorted({e.split for e in examples if e.split})
            raise DatasetError(f"{source}: no example of split {split!r} for seed {seed} (the file has "
                               f"{', '.join(have)}). Add records with \"split\": \"{split}\" or use seeds of "
                               "those splits.")
        return pool[(seed - SPLITS[split].start) % len(pool)]
    return examples[seed % len(examples)]


__all__ = [
    "PALETTE", "KINDS", "BACKGROUND", "PAD_COLOUR", "TASKS", "DatasetError", "Shape", "Example", "display_size",
    "to_original", "to_display", "resize_for_display", "zoom_crop", "normalize_answer", "answer_point",
    "score_answer", "answer_is_well_formed", "reference_answer", "question_text", "describe_scene",
    "render_scene", "generate_scene", "generate_example", "example_record", "write_synthetic", "load_dataset",
    "example_for_seed",
]
