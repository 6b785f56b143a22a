"""ViGoRL envs: answer a question about an image with grounded thinking, optionally zooming in.

Two envs (docs/algorithms.md reference section 10), registered as ``vigorl_search`` (:class:`VigorlSearchEnv`,
one turn) and ``vigorl_zoom`` (:class:`VigorlZoomEnv`, multi-turn with a zoom tool).

Action format:
    ``<think> ... (x1, y1) ... (x2, y2) </think><answer>ANSWER</answer>`` (the ``free_think``
    tags; every ``(x, y)`` in the thinking cites a pixel of the shown image: x to the right, y
    down, (0, 0) top-left). ``ANSWER`` is a point ``(x, y)`` for "where" questions (bbox ground
    truth) or a short text. ``vigorl_zoom`` also accepts
    ``<think>...</think><tool_call>{"name": "search_coordinate", "arguments": {"coordinate": [x, y]}}</tool_call>``;
    coordinates, in every turn, are pixels of the FIRST (full) image. Parsing:
    :func:`vagent.vigorl.grounding.parse_grounded` (never raises; out-of-bounds citations are
    invalid and do not count as grounding; a ``vigorl_zoom`` reply is cut after ``</tool_call>``).

Observation:
    ``render="vision"``: the question, the image resized so its long side is ``image_size``
    (``<image>``) and the format reminder. A zoom answers with a crop of the ORIGINAL image
    centred at the mapped point (``zoom_half_size`` original pixels each side, padded outside
    the image, resized to ``image_size`` square, a red dot at the centre with ``zoom_dot``).
    ``render="text"``: the scene description instead of the image (coordinates are then original
    pixels: nothing is resized); a zoom lists the shapes in the window (synthetic scenes only).
    Later observations start with a feedback line about the last reply.

Rewards:
    ``vigorl_search``: ``reward_accuracy * acc + reward_format * fmt * g`` (0.5 / 0.5), acc in
    {0, 1} (:func:`vagent.vigorl.data.score_answer`, from the ``<answer>`` block even when the
    format fails, as ViGoRL), g = at least one valid point cited. ``vigorl_zoom``: at the answer
    turn ``reward_accuracy * acc + reward_format * fmt * (1 + zoom_bonus * (n_distinct - 1))``
    (0.6 / 0.4 / 0.2), fmt = every turn of the episode was valid (correct format, tool calls
    within the budget); 0 on other turns. The zoom bonus is OFF unless ``zoom_bonus_enabled``
    (or the ``paper`` preset): deviation from ViGoRL, where it is a known hacking lever.

Episode end:
    ``vigorl_search``: terminated after the one reply, whatever it is. ``vigorl_zoom``:
    terminated by a well-formed answer; an invalid turn (bad format, bad tool call, zoom past
    ``max_zooms``) only costs the turn; truncated after ``max_steps`` turns.

Arguments:
    :class:`VigorlSearchConfig` / :class:`VigorlZoomConfig` (``vagent envs vigorl_zoom`` lists
    them): ``data`` (a JSONL dataset; empty = the synthetic generator, the seed fully determines
    the example), ``task``, ``canvas_size``, ``image_size``, the reward fields, zoom fields.

Version:
    v1. Info keys: docs/vigorl.md. Deviations from ViGoRL: padded (always centred) crops, the
    zoom bonus off by default, invalid turns continue the episode instead of ending it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image

from vagent.config import ConfigError
from vagent.envs.base import IMAGE_PLACEHOLDER, EnvError, Observation, StepResult
from vagent.envs.formats import DESCRIPTION_STYLES
from vagent.envs.grid import EpisodeClock
from vagent.envs.registry import EnvConfig
from vagent.vigorl import data as D
from vagent.vigorl.grounding import (
    TOOL_NAME, GroundedReply, distinct_zooms, format_point, multi_turn_reward, parse_grounded, single_turn_reward,
)

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


def _check_config(cfg: VigorlSearchConfig, where: str) -> None:
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


def _system_prompt(task: str, tools: str = "") -> str:
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


_SEARCH_EXAMPLE = ("Example reply:\n<think>I need the green square. The shape at (40, 52) is a red circle, not it. "
                   "The shape at (150, 98) is a green square.</think><answer>(150, 98)</answer>")


def _reminder(hint: str, zooms_left: int | None = None) -> str:
    text = (f"Answer in the format <think>...</think><answer>...</answer>, citing the image points you look at "
            f"as (x, y) inside <think>; <answer> holds {hint}.")
    if zooms_left is not None:
        text += (f" Or zoom first: <think>...</think><tool_call>{{\"name\": \"{TOOL_NAME}\", \"arguments\": "
                 f"{{\"coordinate\": [x, y]}}}}</tool_call> ({zooms_left} zoom(s) left).")
    return text


class _Source:
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


def _step_info(parsed: GroundedReply, valid: bool, accuracy: float, **extra: Any) -> dict[str, Any]:
    info = {
        "format_ok": parsed.format_ok, "format_error": parsed.error, "action_is_valid": bool(valid),
        "success": accuracy >= 1.0, "accuracy": float(accuracy), "grounded": parsed.grounded,
        "n_points": len(parsed.points), "n_invalid_points": len(parsed.invalid_points),
        "parsed": parsed.as_parsed_response(),
    }
    info.update(extra)
    return info


def _reference_answer(clock: EpisodeClock, task: TaskView | None) -> list[str]:
    """``optimal_actions`` of both envs: the correct answer (bbox centre in shown pixels, or the
    text answer); [] after the end."""
    clock.require_started()
    return [] if clock.over else [D.reference_answer(task.example, task.shown)]


def _shown_task(task: TaskView | None) -> TaskView:
    """The ``task`` property of both envs: the current example as shown (after ``reset``)."""
    if task is None:
        raise EnvError("vigorl: call reset(seed) first.")
    return task


#: upper bounds checked by make() and the env server (vagent/envs/limits.py; docs/envs.md)
SEARCH_BOUNDS = {"canvas_size": (64, 2048), "image_size": (16, 1024)}


class VigorlSearchEnv:
    """One question, one grounded answer (see the module docstring)."""

    Config = VigorlSearchConfig
    action_names: tuple[str, ...] = ()
    action_sep = ""
    config_bounds = SEARCH_BOUNDS
    #: only the operator of an env server sets this (a dataset file on the server)
    server_only = ("data",)

    def __init__(self, config: VigorlSearchConfig | None = None) -> None:
        cfg = config if config is not None else VigorlSearchConfig()
        _check_config(cfg, "vigorl_search")
        self.config = cfg
        preset = REWARD_PRESETS[cfg.rewards]
        self.w_accuracy = preset["search_accuracy"] if cfg.reward_accuracy is None else float(cfg.reward_accuracy)
        self.w_format = preset["search_format"] if cfg.reward_format is None else float(cfg.reward_format)
        self._source = _Source(cfg, "vigorl_search")
        self._clock = EpisodeClock("vigorl_search", 1)
        self._task: TaskView | None = None
        self._answer: str | None = None

    def reset(self, seed: int) -> tuple[Observation, dict]:
        self._task = TaskView(self._source.example(int(seed)), self.config)
        self._answer = None
        self._clock.reset()
        text, images = self._task.image_block()
        obs = Observation("\n".join([self._task.question(), text, _reminder(self._task.answer_hint())]), images)
        return obs, {"success": False, "example_id": self._task.example.id}

    def step(self, response: str) -> StepResult:
        self._clock.tick()
        task = self._task
        w, h = task.shown
        parsed = parse_grounded(response, w, h)
        acc = task.score(parsed.answer)
        valid = parsed.format_ok and D.answer_is_well_formed(task.example, parsed.answer, task.shown)
        reward = single_turn_reward(acc, parsed.format_ok, parsed.grounded, w_accuracy=self.w_accuracy,
                                    w_format=self.w_format)
        self._answer = parsed.answer
        self._clock.finish(True)
        line = (f"Answer received: {parsed.answer[:60]}." if parsed.format_ok
                else f"Last reply: format error ({parsed.error}).")
        text, images = task.image_block()
        obs = Observation(f"{line} The episode is over.\n{text}", images)
        info = _step_info(parsed, valid, acc, accuracy_term=self.w_accuracy * acc,
                          format_term=reward - self.w_accuracy * acc, answer=parsed.answer)
        return StepResult(obs, float(reward), True, False, info)

    def system_prompt(self) -> str:
        return _system_prompt(_SEARCH_EXAMPLE)

    def state(self) -> dict:
        self._clock.require_started()
        return {**self._task.state(), "answered": self._answer is not None, "given_answer": self._answer}

    def close(self) -> None:
        self._task = None
        self._clock.close()

    def optimal_actions(self) -> list[str]:
        """The correct answer (bbox centre in shown pixels, or the text answer); [] after the end."""
        return _reference_answer(self._clock, self._task)

    # for the MCTS and the traces: the example and what the model sees
    @property
    def task(self) -> TaskView:
        """The current example as shown (after ``reset``)."""
        return _shown_task(self._task)


class VigorlZoomEnv:
    """Grounded answers with up to ``max_zooms`` zoom-in tool calls (see the module docstring)."""

    Config = VigorlZoomConfig
    action_names: tuple[str, ...] = ()
    action_sep = ""
    config_bounds = {**SEARCH_BOUNDS, "max_zooms": (1, 16), "max_steps": (1, 64), "zoom_half_size": (4, 2048)}
    server_only = ("data",)
    #: a reply ends after either closing tag: generation stops there (vagent.recipes adds these
    #: to ``rollout.stop``), so no tokens after a tool call are sampled or trained on
    reply_stop: tuple[str, ...] = ("</answer>", "</tool_call>")

    def __init__(self, config: VigorlZoomConfig | None = None) -> None:
        cfg = config if config is not None else VigorlZoomConfig()
        _check_config(cfg, "vigorl_zoom")
        if cfg.max_zooms < 1:
            raise ConfigError(f"vigorl_zoom.max_zooms: expected >= 1, got {cfg.max_zooms} (use vigorl_search "
                              "for answers without zooming).")
        if cfg.max_steps < cfg.max_zooms + 1:
            raise ConfigError(f"vigorl_zoom.max_steps ({cfg.max_steps}) must be >= max_zooms + 1 "
                              f"({cfg.max_zooms + 1}) so the model can zoom every time and still answer.")
        if cfg.zoom_half_size < 4:
            raise ConfigError(f"vigorl_zoom.zoom_half_size: expected >= 4 pixels, got {cfg.zoom_half_size}.")
        if cfg.zoom_min_distance < 0 or cfg.zoom_bonus < 0:
            raise ConfigError("vigorl_zoom.zoom_min_distance and zoom_bonus must be >= 0.")
        self.config = cfg
        preset = REWARD_PRESETS[cfg.rewards]
        self.w_accuracy = preset["zoom_accuracy"] if cfg.reward_accuracy is None else float(cfg.reward_accuracy)
        self.w_format = preset["zoom_format"] if cfg.reward_format is None else float(cfg.reward_format)
        self.bonus_enabled = bool(preset["bonus"] if cfg.zoom_bonus_enabled is None else cfg.zoom_bonus_enabled)
        self._source = _Source(cfg, "vigorl_zoom")
        if cfg.render == "text" and self._source.examples is not None:
            if any(not e.shapes for e in self._source.examples):
                raise ConfigError("vigorl_zoom: render='text' zooms list the shapes in the window, so every record "
                                  "needs \"shapes\" (make-data writes them). Use render='vision'.")
        self._clock = EpisodeClock("vigorl_zoom", cfg.max_steps)
        self._task: TaskView | None = None
        self._zooms: list[tuple[int, int]] = []
        self._all_valid = True
        self._answer: str | None = None

    # -- contract ---------------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[Observation, dict]:
        self._task = TaskView(self._source.example(int(seed)), self.config)
        self._zooms, self._all_valid, self._answer = [], True, None
        self._clock.reset()
        text, images = self._task.image_block()
        obs = Observation("\n".join([self._task.question(), text, self._reminder()]), images)
        return obs, {"success": False, "example_id": self._task.example.id}

    def step(self, response: str) -> StepResult:
        self._clock.tick()
        task, cfg = self._task, self.config
        w, h = task.shown
        parsed = parse_grounded(response, w, h, allow_tool=True)
        extra: dict[str, Any] = {"tool_error": None}
        if parsed.kind == "tool":
            if len(self._zooms) >= cfg.max_zooms:
                extra["tool_error"] = f"no zooms left (max_zooms={cfg.max_zooms}): answer now"
                return self._invalid(parsed, f"no zooms left ({cfg.max_zooms} used); answer now.", extra)
            call = parsed.tool_call
            self._zooms.append((call.x, call.y))
            terminated, reward, acc = False, 0.0, 0.0
            truncated = self._clock.finish(False)
            obs = self._zoom_observation(call.x, call.y)
            info = self._info(parsed, True, acc, reward, extra)
            return StepResult(obs, float(reward), terminated, truncated, info)
        if parsed.kind == "answer":
            acc = task.score(parsed.answer)
            well_formed = D.answer_is_well_formed(task.example, parsed.answer, task.shown)
            fmt = self._all_valid
            n_distinct = distinct_zooms(self._zooms, cfg.zoom_min_distance)
            reward = multi_turn_reward(acc, fmt, n_distinct, w_accuracy=self.w_accuracy, w_format=self.w_format,
                                       zoom_bonus=cfg.zoom_bonus, bonus_enabled=self.bonus_enabled)
            self._answer = parsed.answer
            self._clock.finish(True)
            text, images = task.image_block()
            obs = Observation(f"Answer received: {parsed.answer[:60]}. The episode is over.\n{text}", images)
            info = self._info(parsed, well_formed, acc, reward, extra, episode_format_ok=fmt)
            return StepResult(obs, float(reward), True, False, info)
        return self._invalid(parsed, f"format error ({parsed.error}); nothing happened.", extra)

    def system_prompt(self) -> str:
        cfg = self.config
        tools = (f"Before answering you may zoom in: reply <think>...</think><tool_call>{{\"name\": \"{TOOL_NAME}\", "
                 f"\"arguments\": {{\"coordinate\": [x, y]}}}}</tool_call> and you receive a magnified crop of the "
                 f"original image centred at (x, y). Coordinates always refer to the first, full image. You may zoom "
                 f"at most {cfg.max_zooms} times, then you must answer.")
        example = ("Example replies:\n<think>I need the green square. Something small is at (150, 98); I zoom in."
                   f"</think><tool_call>{{\"name\": \"{TOOL_NAME}\", \"arguments\": {{\"coordinate\": [150, 98]}}}}"
                   "</tool_call>\n<think>The crop shows a green square at (150, 98).</think><answer>(150, 98)</answer>")
        return _system_prompt(example, tools)

    def state(self) -> dict:
        self._clock.require_started()
        return {**self._task.state(), "zooms": [list(z) for z in self._zooms], "zooms_left": self._zooms_left(),
                "all_turns_valid": self._all_valid, "answered": self._answer is not None,
                "given_answer": self._answer}

    def close(self) -> None:
        self._task = None
        self._clock.close()

    def optimal_actions(self) -> list[str]:
        """The correct answer (answering at once is optimal with the bonus off); [] after the end."""
        return _reference_answer(self._clock, self._task)

    @property
    def task(self) -> TaskView:
        """The current example as shown (after ``reset``)."""
        return _shown_task(self._task)

    # -- helpers ----------------------------------------------------------------------------
    def _zooms_left(self) -> int:
        return self.config.max_zooms - len(self._zooms)

    def _reminder(self) -> str:
        left = self._zooms_left()
        return _reminder(self._task.answer_hint(), left) if left > 0 else (
            _reminder(self._task.answer_hint()) + " No zooms left: answer now.")

    def _info(self, parsed: GroundedReply, valid: bool, acc: float, reward: float, extra: dict,
              episode_format_ok: bool | None = None) -> dict[str, Any]:
        cfg = self.config
        return _step_info(parsed, valid, acc, **extra, zooms_used=len(self._zooms),
                          n_distinct_zooms=distinct_zooms(self._zooms, cfg.zoom_min_distance),
                          episode_format_ok=self._all_valid if episode_format_ok is None else episode_format_ok,
                          answer=parsed.answer if parsed.kind == "answer" else None)

    def _invalid(self, parsed: GroundedReply, why: str, extra: dict) -> StepResult:
        self._all_valid = False
        truncated = self._clock.finish(False)
        text, images = self._task.image_block("The image again")
        obs = Observation("\n".join([f"Last reply: {why}", text, self._reminder()]), images)
        info = self._info(parsed, False, 0.0, 0.0, extra)
        return StepResult(obs, 0.0, False, truncated, info)

    def _zoom_observation(self, x: int, y: int) -> Observation:
        task, cfg = self._task, self.config
        ox, oy = D.to_original((x, y), task.shown, task.example.size)
        half = cfg.zoom_half_size
        k = len(self._zooms)
        head = f"Zoom {k}/{cfg.max_zooms} at {format_point((x, y))}"
        if task.vision:
            crop = D.zoom_crop(task.original, (ox, oy), half, cfg.image_size, cfg.zoom_dot)
            scale = max(task.example.size) / (2 * half)  # crop pixels per shown pixel of the full view
            text = f"{head}: the region around it, magnified {scale:.1f}x: {IMAGE_PLACEHOLDER}"
            return Observation("\n".join([text, self._reminder()]), (crop,))
        inside = [s for s in task.example.shapes
                  if s.bbox[0] <= ox + half and s.bbox[2] >= ox - half and s.bbox[1] <= oy + half and s.bbox[3] >= oy - half]
        listing = "; ".join(f"a {s.name} centred at {format_point((s.x, s.y))}" for s in inside) or "nothing but background"
        text = f"{head}: the window x {ox - half}..{ox + half}, y {oy - half}..{oy + half} holds {listing}."
        return Observation("\n".join([text, self._reminder()]), ())


def describe_state(state: dict, style: str = "natural") -> str:
    """A correct sentence about the answer of ``state`` (what ``SolverPolicy`` writes as reasoning)."""
    return f"The answer to '{state['question']}' is {state['reference_answer']}."


__all__ = ["VigorlSearchConfig", "VigorlZoomConfig", "VigorlSearchEnv", "VigorlZoomEnv", "TaskView", "REWARD_PRESETS",
           "describe_state"]
