"""What both ViGoRL envs share: their configs and reward presets, where examples come from, the
example as the model sees it (:class:`TaskView`), the prompts, and the ``info`` of a step.

The envs themselves, with the env template (action format, observation, rewards, episode end),
are :mod:`vagent.vigorl.env`, which re-exports the configs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image

from vagent.config import ConfigError
from vagent.envs.base import IMAGE_PLACEHOLDER, EnvError
from vagent.envs.formats import DESCRIPTION_STYLES
from vagent.envs.grid import EpisodeClock
from vagent.envs.registry import EnvConfig
from vagent.vigorl import data as D
from vagent.vigorl.grounding import TOOL_NAME, GroundedReply

REWARD_PRESETS = {
    "lite": {"search_accuracy": 0.5, "search_format": 0.5, "zoom_accuracy": 0.6, "zoom_format": 0.4, "bonus": False},
    "paper": {"search_accuracy": 0.5, "search_format": 0.5, "zoom_accuracy": 0.6, "zoom_format": 0.4, "bonus": True},
}


@dataclass
class VigorlSearchConfig(EnvConfig):
    """Options of ``vigorl_search`` (and, extended, ``vigorl_zoom``)."""

    #: reasoning format: only "free_think" (<think> with cited (x, y) points, then <answer>)
    format: str = "free_think"
    #: unused (one answer per reply); kept from EnvConfig
    max_actions_per_turn: int = 1
    #: reward preset: "lite" (ours: zoom bonus off) or "paper" (ViGoRL: zoom bonus on)
    rewards: str = "lite"
    #: JSONL dataset (docs/vigorl.md; paths relative to the CWD); empty = synthetic example per seed
    data: str = ""
    #: synthetic question type: mixed, where (answer a point) or colour (answer a word)
    task: str = "mixed"
    #: side of the synthetic (original) image in pixels
    canvas_size: int = 448
    #: long side of the image shown to the model (and of zoom crops); match the model processor's size
    image_size: int = 224
    #: weight of accuracy; None = preset (search 0.5, zoom 0.6)
    reward_accuracy: float | None = None
    #: weight of the format term; None = preset (search 0.5, zoom 0.4)
    reward_format: float | None = None


@dataclass
class VigorlZoomConfig(VigorlSearchConfig):
    """Options of ``vigorl_zoom``: the search options plus the zoom tool."""

    #: most zoom crops per episode (ViGoRL: 4); a later tool call is an invalid turn
    max_zooms: int = 4
    #: turns before the episode is truncated (>= max_zooms + 1)
    max_steps: int = 6
    #: half the side of the crop window in ORIGINAL pixels (the fixed offset around the point)
    zoom_half_size: int = 56
    #: draw a red dot at the centre of each crop
    zoom_dot: bool = False
    #: pay the per-distinct-zoom bonus; None = preset (lite off, paper on). A known hacking lever
    zoom_bonus_enabled: bool | None = None
    #: bonus per distinct zoom beyond the first, inside the format term (ViGoRL: 0.2)
    zoom_bonus: float = 0.2
    #: zooms closer than this (shown pixels, Euclidean) to a counted one are not distinct
    zoom_min_distance: float = 10.0


def check_config(cfg: VigorlSearchConfig, where: str) -> None:
    if cfg.format != "free_think":
        raise ConfigError(f"{where}.format: ViGoRL's grounded format is free_think (<think> citing (x, y) "
                          f"points, then <answer>); got {cfg.format!r}. Set format=free_think or drop it.")
    if cfg.render not in ("vision", "text"):
        raise ConfigError(f"{where}.render: expected 'vision' or 'text', got {cfg.render!r}.")
    if cfg.description_style not in DESCRIPTION_STYLES:
        raise ConfigError(f"{where}.description_style: expected one of {', '.join(DESCRIPTION_STYLES)}.")
    if cfg.rewards not in REWARD_PRESETS:
        raise ConfigError(f"{where}.rewards: unknown preset {cfg.rewards!r}; valid: {', '.join(REWARD_PRESETS)}.")
    if cfg.task not in D.TASKS:
        raise ConfigError(f"{where}.task: expected one of {', '.join(D.TASKS)}, got {cfg.task!r}.")
    if cfg.canvas_size < 64:
        raise ConfigError(f"{where}.canvas_size: expected >= 64 pixels, got {cfg.canvas_size}.")
    if cfg.image_size < 16:
        raise ConfigError(f"{where}.image_size: expected >= 16 pixels, got {cfg.image_size}.")


class TaskView:
    """The current example as the model sees it: shown size and image, question text, scoring."""

    def __init__(self, example: D.Example, cfg: VigorlSearchConfig):
        self.example, self.cfg = example, cfg
        self.vision = cfg.render == "vision"
        self.shown = D.display_size(example.size, cfg.image_size) if self.vision else tuple(example.size)
        self._original: Image.Image | None = None
        self._display: Image.Image | None = None

    @property
    def original(self) -> Image.Image:
        if self._original is None:
            self._original = self.example.load_image()
        return self._original

    @property
    def display(self) -> Image.Image:
        if self._display is None:
            self._display = D.resize_for_display(self.original, self.cfg.image_size)
        return self._display

    def question(self) -> str:
        return D.question_text(self.example, self.shown)

    def image_block(self, label: str = "Image") -> tuple[str, tuple[Image.Image, ...]]:
        w, h = self.shown
        if self.vision:
            return f"{label} ({w} x {h} pixels): {IMAGE_PLACEHOLDER}", (self.display,)
        desc = self.example.description or D.describe_scene(self.example.shapes, self.example.size)
        return f"{label} ({w} x {h} pixels, described in text): {desc}", ()

    def answer_hint(self) -> str:
        return "a point (x, y) in pixels of the image" if self.example.kind == "bbox" else "a short text answer"

    def score(self, answer: str) -> float:
        return D.score_answer(self.example, answer, self.shown)

    def state(self) -> dict[str, Any]:
        ex = self.example
        return {
            "example_id": ex.id, "question": self.question(), "kind": ex.kind, "answer": ex.answer,
            "bbox": list(ex.bbox) if ex.bbox else None, "original_size": list(ex.size), "shown_size": list(self.shown),
            "reference_answer": D.reference_answer(ex, self.shown), "shapes": [s.to_dict() for s in ex.shapes],
        }


def system_prompt_text(task: str, tools: str = "") -> str:
    lines = [
        "You answer questions about an image by reasoning step by step, grounding every step in the image.",
        "Write your reasoning inside <think>...</think>. In it, cite each place of the image you look at as "
        "(x, y): integer pixel coordinates of the image as shown to you, x growing to the right, y growing "
        "downward, (0, 0) the top-left pixel.",
        "Then give the final answer inside <answer>...</answer>: a point (x, y) when the question asks where "
        "something is, otherwise a short text answer. Write nothing outside the tags.",
    ]
    if tools:
        lines.append(tools)
    lines.append(task)
    return "\n".join(lines)


SEARCH_EXAMPLE = ("Example reply:\n<think>I need the green square. The shape at (40, 52) is a red circle, not it. "
                   "The shape at (150, 98) is a green square.</think><answer>(150, 98)</answer>")


def reminder_text(hint: str, zooms_left: int | None = None) -> str:
    text = (f"Answer in the format <think>...</think><answer>...</answer>, citing the image points you look at "
            f"as (x, y) inside <think>; <answer> holds {hint}.")
    if zooms_left is not None:
        text += (f" Or zoom first: <think>...</think><tool_call>{{\"name\": \"{TOOL_NAME}\", \"arguments\": "
                 f"{{\"coordinate\": [x, y]}}}}</tool_call> ({zooms_left} zoom(s) left).")
    return text


class ExampleSource:
    """Where examples come from: the synthetic generator or a JSONL dataset."""

    def __init__(self, cfg: VigorlSearchConfig, where: str):
        self.cfg = cfg
        self.examples: tuple[D.Example, ...] | None = None
        if cfg.data:
            try:
                self.examples = D.load_dataset(cfg.data)
            except D.DatasetError as exc:
                raise ConfigError(f"{where}.data: {exc}") from exc
            if cfg.render == "text":
                lacking = [e.id for e in self.examples if not (e.description or e.shapes)]
                if lacking:
                    raise ConfigError(f"{where}: render='text' needs a \"description\" (or \"shapes\") in every "
                                      f"record; {len(lacking)} lack it (first: {lacking[0]}). Use render='vision'.")

    def example(self, seed: int) -> D.Example:
        if self.examples is None:
            return D.generate_example(seed, self.cfg.canvas_size, self.cfg.task)
        return D.example_for_seed(self.examples, seed, self.cfg.data)


def step_info(parsed: GroundedReply, valid: bool, accuracy: float, **extra: Any) -> dict[str, Any]:
    info = {
        "format_ok": parsed.format_ok, "format_error": parsed.error, "action_is_valid": bool(valid),
        "success": accuracy >= 1.0, "accuracy": float(accuracy), "grounded": parsed.grounded,
        "n_points": len(parsed.points), "n_invalid_points": len(parsed.invalid_points),
        "parsed": parsed.as_parsed_response(),
    }
    info.update(extra)
    return info


def optimal_answer(clock: EpisodeClock, task: TaskView | None) -> list[str]:
    """``optimal_actions`` of both envs: the correct answer (bbox centre in shown pixels, or the
    text answer); [] after the end."""
    clock.require_started()
    return [] if clock.over else [D.reference_answer(task.example, task.shown)]


def shown_task(task: TaskView | None) -> TaskView:
    """The ``task`` property of both envs: the current example as shown (after ``reset``)."""
    if task is None:
        raise EnvError("vigorl: call reset(seed) first.")
    return task


#: upper bounds checked by make() and the env server (vagent/envs/limits.py; docs/envs.md)
SEARCH_BOUNDS = {"canvas_size": (64, 2048), "image_size": (16, 1024)}
