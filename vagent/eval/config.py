"""The declared config of ``vagent eval``: envs x seed ranges x models x reasoning formats.

A run evaluates every (env, format, model) cell on every seed of the cell's seed ranges,
``group_size`` episodes per seed. YAML (``configs/eval_example.yaml``) and the quick CLI flags
fill the same dataclasses; unknown keys are errors (``vagent.config.from_mapping``).

Seed ranges name a split (``vagent.seeds``), never raw seeds, so evaluation seeds can never
overlap training seeds (docs/algorithms.md reference bug 2):

- ``"val:0-19"``: seeds 0..19 of the ``val`` split (offsets inside the split, inclusive);
- ``"test:100"``: the first 100 seeds of ``test``;
- ``"val:20+10"``: 10 seeds of ``val`` starting at offset 20.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from vagent.config import ConfigError, from_mapping
from vagent.rollout.policy import SamplingConfig

BACKENDS = ("hf", "openai", "anthropic", "gemini")

#: default environment variables for the base URL and API key of each API backend
DEFAULT_ENV_VARS = {
    "openai": ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
    "anthropic": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
    "gemini": ("GEMINI_BASE_URL", "GEMINI_API_KEY"),
}

#: sampling defaults of evaluation (greedy, room for reasoning) where SamplingConfig's training defaults differ
EVAL_SAMPLING_DEFAULTS = {"temperature": 0.0, "max_new_tokens": 256}

_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass
class ModelSpec:
    """One model to evaluate and how to reach it (a backend of ``vagent.eval.backends``)."""

    #: which backend answers: hf (local checkpoint), openai (any OpenAI-compatible chat endpoint), anthropic, gemini
    backend: Literal["hf", "openai", "anthropic", "gemini"] = "openai"
    #: the API model id (e.g. gpt-4.1-mini), or for hf a local model directory
    model: str = ""
    #: label in outputs and folder names (letters, digits, . _ -); empty = derived from model
    name: str = ""
    #: endpoint base URL; empty = the backend's env var (OPENAI_BASE_URL, ANTHROPIC_BASE_URL, GEMINI_BASE_URL) or the SDK default
    base_url: str = ""
    #: name of the environment variable holding the API key; empty = OPENAI_API_KEY / ANTHROPIC_API_KEY / GEMINI_API_KEY
    api_key_env: str = ""
    #: the API key itself (prefer api_key_env: keys in files leak); never written to the run's config.yaml
    api_key: str = ""
    #: the most requests of this model in flight at once (one semaphore shared by all its calls)
    concurrency: int = 4
    #: request rate limit (token bucket, burst = concurrency); 0 = unlimited
    requests_per_minute: float = 0.0
    #: seconds before one request is abandoned (then retried like a 5xx)
    timeout_s: float = 60.0
    #: retries after the first attempt, for 408/429/5xx, timeouts and connection errors; other 4xx never retry
    max_retries: int = 4
    #: first backoff delay; attempt k waits min(backoff_max_s, backoff_base_s * 2**k) * U(0.5, 1) (jitter)
    backoff_base_s: float = 1.0
    #: cap of the exponential backoff delay
    backoff_max_s: float = 30.0
    #: a Retry-After longer than this fails the request instead of sleeping
    max_retry_after_s: float = 120.0
    #: "server": send stop strings to the API and restore the stop string it strips; "client": send none and cut the reply after the first stop string
    stop_mode: Literal["server", "client"] = "server"
    #: openai: name of the length limit parameter (newer OpenAI models accept only max_completion_tokens)
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    #: send SamplingConfig.seed to APIs that accept one (openai, gemini); off by default so group samples differ
    send_seed: bool = False
    #: send temperature/top_p/top_k; null = the backend's default (openai, gemini: yes; anthropic: no, the anthropic SDK 2.x Messages API takes none, so they go in extra_body only when true)
    send_sampling: bool | None = None
    #: openai: when the server moved <think>...</think> into a reasoning_content/reasoning field (transformers serve, vLLM/SGLang reasoning parsers), put it back in front of the content
    restore_think: bool = True
    #: hf: device of the local model
    device: str = "cpu"
    #: hf: dtype (auto, float32, bfloat16)
    dtype: str = "auto"
    #: hf: episodes rolled out together, their turns generated in one batch (batch_size // group_size seeds per call)
    batch_size: int = 8
    #: hf: a GGUF file inside the model directory (text-only models)
    gguf_file: str = ""
    #: hf: the most tokens one sample may hold (context + max_new_tokens); 0 = unlimited
    max_context_tokens: int = 0

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        base = Path(self.model.rstrip("/")).name if self.backend == "hf" else self.model
        return re.sub(r"[^A-Za-z0-9._-]+", "_", base).strip("_") or self.backend

    def resolved_base_url(self) -> str | None:
        """``base_url``, else the backend's env var, else None (the SDK's default endpoint)."""
        if self.base_url:
            return self.base_url
        var = DEFAULT_ENV_VARS.get(self.backend, ("", ""))[0]
        return (os.environ.get(var) or None) if var else None

    def resolved_api_key(self) -> str:
        """``api_key``, else the variable ``api_key_env`` (or the backend's default); ConfigError if unset."""
        if self.api_key:
            return self.api_key
        var = self.api_key_env or DEFAULT_ENV_VARS[self.backend][1]
        key = os.environ.get(var)
        if not key:
            raise ConfigError(
                f"model '{self.label}' ({self.backend}): the API key variable {var} is not set. "
                f"Export {var}=... (any non-empty value for a local server), or set api_key_env to the "
                "variable that holds it."
            )
        return key

    def validate(self, where: str) -> None:
        if not self.model:
            raise ConfigError(f"{where}.model is empty: give the API model id or, for backend hf, a model directory.")
        if not _LABEL_RE.match(self.label):
            raise ConfigError(f"{where}.name {self.label!r}: use letters, digits, '.', '_' or '-' (it names folders).")
        for k in ("concurrency", "batch_size"):
            if getattr(self, k) < 1:
                raise ConfigError(f"{where}.{k} must be >= 1, got {getattr(self, k)}.")
        for k in ("timeout_s", "backoff_base_s", "backoff_max_s"):
            if getattr(self, k) <= 0:
                raise ConfigError(f"{where}.{k} must be > 0, got {getattr(self, k)}.")
        if self.max_retries < 0 or self.requests_per_minute < 0 or self.max_context_tokens < 0:
            raise ConfigError(f"{where}: max_retries, requests_per_minute and max_context_tokens must be >= 0.")


@dataclass
class EvalEnv:
    """One environment of the run (the format comes from ``EvalConfig.formats``)."""

    #: registered env name (``vagent envs`` lists them), e.g. frozenlake, sokoban
    name: str = ""
    #: label in outputs and folder names; empty = name (two entries of one env need distinct labels)
    label: str = ""
    #: env config fields (``vagent envs`` lists them), e.g. {render: text, size: 4}; not "format"
    config: dict = field(default_factory=dict)
    #: seed ranges of this env; empty = EvalConfig.seeds
    seeds: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return self.label or self.name


@dataclass
class EvalConfig:
    """A whole evaluation run (see the module docstring)."""

    #: the environments
    envs: list[EvalEnv] = field(default_factory=list)
    #: the models
    models: list[ModelSpec] = field(default_factory=list)
    #: reasoning formats, each a separate cell: no_think, free_think, grounding, worldmodeling, grounding_worldmodeling
    formats: list[str] = field(default_factory=lambda: ["grounding_worldmodeling"])
    #: seed ranges for every env without its own: "split:a-b" (offsets a..b), "split:n" (first n), "split:a+n"
    seeds: list[str] = field(default_factory=lambda: ["val:0-19"])
    #: episodes per seed (samples of the same env, seed and config)
    group_size: int = 1
    #: turn limit per episode (reaching it truncates the episode)
    max_turns: int = 5
    #: context of each turn: concat (whole history) or no_concat (system + current observation), as in training
    mode: Literal["concat", "no_concat"] = "concat"
    #: concat only: turns of history shown per turn (as in training); null = whole history
    window: int | None = None
    #: sampling parameters shared by every model; keys not given take the eval defaults temperature 0 (greedy) and max_new_tokens 256, the others SamplingConfig's
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(**EVAL_SAMPLING_DEFAULTS))
    #: output folder: episodes/, summary.json, report.html, config.yaml
    out_dir: str = "runs/eval"
    #: rerun every episode, overwriting finished ones
    force: bool = False
    #: on resume, rerun episodes that ended with an error (API failure, env crash)
    retry_errors: bool = True
    #: reasoning judges (a vagent.rewards.ReasoningReward config mapping); empty = no judge scores
    reasoning_reward: dict = field(default_factory=dict)
    #: price table: API model id -> [USD per 1M prompt tokens, USD per 1M completion tokens]; cost is null when absent
    prices: dict = field(default_factory=dict)
    #: write report.html (self-contained, images inline)
    html: bool = True
    #: the most episodes per (env, model, format) cell shown in report.html (all are on disk)
    html_max_episodes: int = 100
    #: save observation images as PNG files next to each episode's JSON
    save_images: bool = True
    #: print the summary table at the end
    print_table: bool = True
    #: modules to import first (your own envs' register calls; dotted names or .py paths;
    #: docs/custom_env.md); vagent eval --import MODULE adds to it
    imports: list[str] = field(default_factory=list)
    #: the training run of the evaluated checkpoint, filled by ``vagent eval`` (run_dir, checkpoint,
    #: the fields taken from the run's config and those set otherwise, warnings where an eval env
    #: differs from the run's); recorded in summary.json, not part of an episode's fingerprint
    training_run: dict = field(default_factory=dict)


def parse_seed_range(spec: str) -> list[int]:
    """Seeds of one range spec (see the module docstring); ConfigError on bad syntax."""
    from vagent.seeds import SPLITS, split_seeds

    m = re.fullmatch(r"\s*([A-Za-z_]+)\s*:\s*(\d+)\s*(?:([-+])\s*(\d+))?\s*", str(spec))
    if not m:
        raise ConfigError(
            f"seed range {spec!r}: expected 'split:a-b' (offsets a..b inclusive), 'split:n' (first n) or "
            f"'split:a+n'; splits: {', '.join(SPLITS)}. Example: 'val:0-19'."
        )
    split, a, op, b = m.group(1), int(m.group(2)), m.group(3), m.group(4)
    if split not in SPLITS:
        raise ConfigError(f"seed range {spec!r}: unknown split '{split}'; valid splits: {', '.join(SPLITS)}.")
    if op is None:
        offset, n = 0, a
    elif op == "-":
        if int(b) < a:
            raise ConfigError(f"seed range {spec!r}: end {b} is before start {a}.")
        offset, n = a, int(b) - a + 1
    else:
        offset, n = a, int(b)
    if n < 1:
        raise ConfigError(f"seed range {spec!r} holds no seed.")
    try:
        return split_seeds(split, n, offset)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"seed range {spec!r}: {exc}") from exc


def resolve_seeds(specs: list[str] | tuple[str, ...], where: str) -> list[int]:
    """The seeds of several ranges, in order; overlapping ranges are an error."""
    seen: dict[int, str] = {}
    out = []
    for spec in specs:
        for s in parse_seed_range(spec):
            if s in seen:
                raise ConfigError(f"{where}: seed {s} is in both {seen[s]!r} and {spec!r}; make the ranges disjoint.")
            seen[s] = spec
            out.append(s)
    if not out:
        raise ConfigError(f"{where}: no seed range given; e.g. seeds: ['val:0-19'].")
    return out


def validate(cfg: EvalConfig) -> None:
    """Check what from_mapping cannot: non-empty axes, unique labels, formats, prices."""
    from vagent.envs.formats import FORMATS

    if not cfg.envs:
        raise ConfigError("eval config: 'envs' is empty; add e.g. envs: [{name: frozenlake}] or pass --env frozenlake.")
    if not cfg.models:
        raise ConfigError("eval config: 'models' is empty; add e.g. models: [{backend: openai, model: gpt-4.1-mini}] "
                          "or pass --model.")
    if not cfg.formats:
        raise ConfigError("eval config: 'formats' is empty; e.g. formats: [no_think].")
    for f in cfg.formats:
        if f not in FORMATS:
            raise ConfigError(f"eval config: unknown format {f!r}; valid formats: {', '.join(FORMATS)}.")
    if len(set(cfg.formats)) != len(cfg.formats):
        raise ConfigError(f"eval config: formats has duplicates: {cfg.formats}.")
    if cfg.group_size < 1 or cfg.max_turns < 1 or (cfg.window or 0) < 0 or cfg.html_max_episodes < 0:
        raise ConfigError("eval config: group_size and max_turns must be >= 1, window and html_max_episodes >= 0.")
    if cfg.mode == "no_concat" and cfg.window is not None:
        raise ConfigError("eval config: window applies to mode concat only; drop window or use mode: concat.")
    _unique([e.key for e in cfg.envs], "envs", "label")
    _unique([m.label for m in cfg.models], "models", "name")
    for i, e in enumerate(cfg.envs):
        if not e.name:
            raise ConfigError(f"eval config: envs[{i}].name is empty; e.g. frozenlake.")
        if not _LABEL_RE.match(e.key):
            raise ConfigError(f"eval config: envs[{i}] label {e.key!r}: use letters, digits, '.', '_' or '-'.")
        if "format" in e.config:
            raise ConfigError(f"eval config: envs[{i}].config sets 'format'; list formats at the top level "
                              "(formats: [...]) so each is its own cell.")
        resolve_seeds(e.seeds or cfg.seeds, f"envs[{i}] ({e.key}) seeds")
    for i, m in enumerate(cfg.models):
        m.validate(f"models[{i}]")
    for model_id, price in cfg.prices.items():
        if (not isinstance(price, (list, tuple)) or len(price) != 2
                or not all(isinstance(p, (int, float)) and p >= 0 for p in price)):
            raise ConfigError(f"eval config: prices[{model_id!r}] = {price!r}; expected [USD per 1M prompt tokens, "
                              "USD per 1M completion tokens], e.g. [0.4, 1.6].")


def _unique(labels: list[str], what: str, field_name: str) -> None:
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ConfigError(f"eval config: {what} has duplicate labels {dup}; give each entry a distinct '{field_name}'.")


def load_config(values: Mapping[str, Any]) -> EvalConfig:
    """An :class:`EvalConfig` from a mapping (YAML), validated (``sampling`` over ``EVAL_SAMPLING_DEFAULTS``)."""
    values = dict(values)
    if isinstance(values.get("sampling"), Mapping):
        values["sampling"] = {**EVAL_SAMPLING_DEFAULTS, **values["sampling"]}
    cfg = from_mapping(EvalConfig, values, where="eval config")
    if cfg.imports:  # before validate looks the env names up
        from vagent.plugins import PluginImportError, import_modules

        try:
            import_modules(cfg.imports)
        except PluginImportError as exc:
            raise ConfigError(f"imports: {exc}") from exc
    validate(cfg)
    return cfg


def load_yaml(path: str | Path) -> dict:
    """The mapping in a YAML file (ConfigError if it is not one)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"eval config file {str(p)!r} does not exist.")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of eval config keys at the top level, got {type(data).__name__}.")
    return data


def replace(cfg: EvalConfig, **changes: Any) -> EvalConfig:
    """A copy of ``cfg`` with ``changes`` (then validated)."""
    out = dataclasses.replace(cfg, **changes)
    validate(out)
    return out


__all__ = [
    "BACKENDS", "ModelSpec", "EvalEnv", "EvalConfig", "parse_seed_range", "resolve_seeds", "validate",
    "load_config", "load_yaml", "replace",
]
