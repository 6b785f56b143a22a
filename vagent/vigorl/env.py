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

from typing import Any

from vagent.config import ConfigError
from vagent.envs.base import IMAGE_PLACEHOLDER, Observation, StepResult
from vagent.envs.grid import EpisodeClock
from vagent.vigorl import data as D
from vagent.vigorl.grounding import (
    TOOL_NAME, GroundedReply, distinct_zooms, format_point, multi_turn_reward, parse_grounded, single_turn_reward,
)
from vagent.vigorl.task import (  # noqa: F401 -- the configs and presets stay importable from here
    REWARD_PRESETS, SEARCH_BOUNDS, SEARCH_EXAMPLE, ExampleSource, TaskView, VigorlSearchConfig, VigorlZoomConfig,
    check_config, optimal_answer, reminder_text, shown_task, step_info, system_prompt_text,
)


class _ShownExample:
    """What both ViGoRL envs share: closing, the correct answer and the example as shown."""

    _task: Any
    _clock: EpisodeClock

    def close(self) -> None:
        self._task = None
        self._clock.close()

    def optimal_actions(self) -> list[str]:
        """The correct answer (the bbox centre in shown pixels, or the text answer; in the zoom env
        answering at once is optimal with the bonus off); [] after the end."""
        return optimal_answer(self._clock, self._task)

    @property
    def task(self) -> TaskView:
        """The current example as shown (after ``reset``)."""
        return shown_task(self._task)


class VigorlSearchEnv(_ShownExample):
    """One question, one grounded answer (see the module docstring)."""

    Config = VigorlSearchConfig
    action_names: tuple[str, ...] = ()
    action_sep = ""
    config_bounds = SEARCH_BOUNDS
    #: only the operator of an env server sets this (a dataset file on the server)
    server_only = ("data",)

    def __init__(self, config: VigorlSearchConfig | None = None) -> None:
        cfg = config if config is not None else VigorlSearchConfig()
        check_config(cfg, "vigorl_search")
        self.config = cfg
        preset = REWARD_PRESETS[cfg.rewards]
        self.w_accuracy = preset["search_accuracy"] if cfg.reward_accuracy is None else float(cfg.reward_accuracy)
        self.w_format = preset["search_format"] if cfg.reward_format is None else float(cfg.reward_format)
        self._source = ExampleSource(cfg, "vigorl_search")
        self._clock = EpisodeClock("vigorl_search", 1)
        self._task: TaskView | None = None
        self._answer: str | None = None

    def reset(self, seed: int) -> tuple[Observation, dict]:
        self._task = TaskView(self._source.example(int(seed)), self.config)
        self._answer = None
        self._clock.reset()
        text, images = self._task.image_block()
        obs = Observation("\n".join([self._task.question(), text, reminder_text(self._task.answer_hint())]), images)
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
        info = step_info(parsed, valid, acc, accuracy_term=self.w_accuracy * acc,
                          format_term=reward - self.w_accuracy * acc, answer=parsed.answer)
        return StepResult(obs, float(reward), True, False, info)

    def system_prompt(self) -> str:
        return system_prompt_text(SEARCH_EXAMPLE)

    def state(self) -> dict:
        self._clock.require_started()
        return {**self._task.state(), "answered": self._answer is not None, "given_answer": self._answer}

    # for the MCTS and the traces: the example and what the model sees (``_ShownExample.task``)


class VigorlZoomEnv(_ShownExample):
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
        check_config(cfg, "vigorl_zoom")
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
        self._source = ExampleSource(cfg, "vigorl_zoom")
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
        return system_prompt_text(example, tools)

    def state(self) -> dict:
        self._clock.require_started()
        return {**self._task.state(), "zooms": [list(z) for z in self._zooms], "zooms_left": self._zooms_left(),
                "all_turns_valid": self._all_valid, "answered": self._answer is not None,
                "given_answer": self._answer}


    # -- helpers ----------------------------------------------------------------------------
    def _zooms_left(self) -> int:
        return self.config.max_zooms - len(self._zooms)

    def _reminder(self) -> str:
        left = self._zooms_left()
        return reminder_text(self._task.answer_hint(), left) if left > 0 else (
            reminder_text(self._task.answer_hint()) + " No zooms left: answer now.")

    def _info(self, parsed: GroundedReply, valid: bool, acc: float, reward: float, extra: dict,
              episode_format_ok: bool | None = None) -> dict[str, Any]:
        cfg = self.config
        return step_info(parsed, valid, acc, **extra, zooms_used=len(self._zooms),
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
