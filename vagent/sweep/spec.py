"""The sweep file: a base run config, overrides, a grid and named variants, and seeds -> trials.

A sweep file (YAML; docs/sweep.md)::

    name: estimators                 # the sweep directory is <out_dir>/<name> (vagent sweep --out overrides)
    base: ../frozenlake_ppo.yaml     # a run config, relative to this file; null = the default preset
    overrides: {steps: 10}           # dotted run-config keys set in every trial
    grid:                            # every combination of the axes (cartesian product)
      ppo.estimator: [masked_gae, bi_level_gae]                # a list: labels are the values
      reasoning_reward: {off: null, rule: {judge: rule}}       # a mapping: label -> value
    variants:                        # named override sets, each crossed with the grid
      no_think: {envs.0.config.format: no_think}
    seeds: [0, 1, 2, 3]
    baseline: "no_think,estimator=bi_level_gae,reasoning_reward=off"   # the report's reference row
    resources: {cpu: 1, gpu: 0}      # Ray resources of one trial
    max_concurrent: 0                # trials at once (0 = as many as the resources allow)

A *row* is one point of variants x grid (a configuration); a *trial* is a row and a seed. Row
names are the variant name and ``<last key part>=<label>`` of each grid axis, joined by commas.
Every trial's run config is built (and validated) here, before any trial starts: the base, then
``overrides``, then the row's values, then ``seed``, ``name`` and ``out_dir``, which the sweep sets.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vagent.config import ConfigError, from_mapping

#: run-config keys a sweep sets itself; a sweep file may not override them
RESERVED_KEYS = ("seed", "name", "out_dir")


@dataclass
class Resources:
    """Ray resources one trial holds while it runs."""

    #: CPUs per trial (set the run's ``threads`` to match)
    cpu: float = 1.0
    #: GPUs per trial (0 = CPU trials; with 1 the run's device auto picks the GPU Ray assigns)
    gpu: float = 0.0


@dataclass
class SweepConfig:
    """One sweep file."""

    #: sweep name; the sweep directory is <out_dir>/<name>
    name: str = "sweep"
    #: base run config (YAML), relative to the sweep file's folder; null = the default preset
    base: str | None = None
    #: dotted run-config keys and values set in every trial
    overrides: dict = field(default_factory=dict)
    #: axes of the grid: dotted key -> list of values, or mapping of label -> value
    grid: dict = field(default_factory=dict)
    #: named rows: name -> {dotted key: value}; each is crossed with the grid
    variants: dict = field(default_factory=dict)
    #: seeds of every row
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    #: the row the report's paired differences are taken against (empty = the first row)
    baseline: str = ""
    #: parent directory of the sweep directory (relative to the working directory)
    out_dir: str = "sweeps"
    #: Ray resources of one trial
    resources: Resources = field(default_factory=Resources)
    #: trials running at once (0 = as many as the cluster's resources allow)
    max_concurrent: int = 0


@dataclass(frozen=True)
class Row:
    """One configuration: its name and the run-config values it sets (dotted key -> value)."""

    name: str
    values: dict


@dataclass(frozen=True)
class Trial:
    """One row at one seed, with its whole run config (a plain mapping, as config.yaml holds)."""

    row: str
    seed: int
    config: dict

    @property
    def trial_id(self) -> str:
        return f"{slug(self.row)}/seed_{self.seed}"


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep file: its settings, rows in order, and every trial."""

    config: SweepConfig
    rows: list[Row]
    trials: list[Trial]
    baseline: str

    def fingerprint(self) -> str:
        """A short hash of every trial's config: a changed sweep file gives a new Tune experiment."""
        text = json.dumps([[t.trial_id, t.config] for t in self.trials], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:10]


def slug(name: str) -> str:
    """A row name as a folder name."""
    return re.sub(r"[^A-Za-z0-9_.=,+-]", "_", name) or "_"


def _label(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _axis(key: str, spec: Any) -> list[tuple[str, Any]]:
    """A grid axis as (label, value) pairs."""
    short = key.split(".")[-1]
    if isinstance(spec, dict):
        pairs = list(spec.items())
    elif isinstance(spec, list):
        pairs = [(_label(v), v) for v in spec]
    else:
        raise ConfigError(f"sweep grid.{key}: expected a list of values or a mapping of label -> value, "
                          f"got {spec!r}. Write e.g. grid: {{{key}: [a, b]}}.")
    if not pairs:
        raise ConfigError(f"sweep grid.{key} is empty: give at least one value.")
    return [(f"{short}={label}", value) for label, value in pairs]


def expand_rows(cfg: SweepConfig) -> list[Row]:
    """variants x grid, in file order (variants outer, the last grid axis fastest)."""
    for name, values in cfg.variants.items():
        if not isinstance(values, dict):
            raise ConfigError(f"sweep variants.{name}: expected a mapping of run-config keys to values, got "
                              f"{values!r}. Write e.g. variants: {{{name}: {{ppo.estimator: masked_gae}}}}.")
    variants = [(str(n), dict(v)) for n, v in cfg.variants.items()] or [("", {})]
    axes = [_axis(str(k), v) for k, v in cfg.grid.items()]
    rows = []
    for (vname, vvalues), point in itertools.product(variants, itertools.product(*axes)):
        keys = list(cfg.grid)
        values = dict(vvalues)
        values.update({k: value for k, (_, value) in zip(keys, point)})
        name = ",".join([vname] * bool(vname) + [label for label, _ in point]) or "base"
        rows.append(Row(name, values))
    names = [r.name for r in rows]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup or len({slug(n) for n in names}) < len(names):
        raise ConfigError(f"sweep rows must have distinct names (as folder names too), found repeats: "
                          f"{dup or names}. Rename the variants or grid labels.")
    return rows


def _override(key: str, value: Any) -> str:
    for reserved in RESERVED_KEYS:
        if key == reserved:
            raise ConfigError(f"sweep key '{key}' is set by the sweep itself (seeds: / the trial's folder); "
                              "remove it from overrides, grid and variants.")
    return f"{key}={json.dumps(value)}"  # JSON is YAML: the run config parses it back exactly


def _check_limits(cfg: SweepConfig) -> None:
    """The seeds are distinct, the resources hold a CPU or a GPU, ``max_concurrent`` is not negative."""
    if not cfg.seeds or len(set(cfg.seeds)) != len(cfg.seeds):
        raise ConfigError(f"sweep seeds must be a non-empty list of distinct integers, got {cfg.seeds}.")
    if cfg.resources.cpu < 0 or cfg.resources.gpu < 0 or cfg.resources.cpu + cfg.resources.gpu <= 0:
        raise ConfigError(f"sweep resources must hold a CPU or a GPU (cpu >= 0, gpu >= 0, not both 0), got "
                          f"cpu={cfg.resources.cpu}, gpu={cfg.resources.gpu}.")
    if cfg.max_concurrent < 0:
        raise ConfigError(f"sweep max_concurrent must be >= 0 (0 = no limit), got {cfg.max_concurrent}.")


def _base_tree(cfg: SweepConfig, sweep_path: Path) -> dict[str, Any]:
    """The run config every trial starts from: the ``base`` file (relative to the sweep file) or the default preset."""
    import yaml

    from vagent.runconfig import default_preset_dict

    if cfg.base is None:
        return default_preset_dict()
    base_path = Path(cfg.base) if Path(cfg.base).is_absolute() else sweep_path.parent / cfg.base
    if not base_path.is_file():
        raise ConfigError(f"sweep base {cfg.base!r}: no file at {base_path} (base is relative to the sweep "
                          "file's folder; null = the default preset).")
    return yaml.safe_load(base_path.read_text()) or {}


def _trials(cfg: SweepConfig, rows: list[Row], base_tree: dict[str, Any]) -> list[Trial]:
    """One trial per row and seed, its run config built from ``base_tree`` with the overrides and validated."""
    from vagent.config import to_dict
    from vagent.runconfig import load_config

    common = [_override(str(k), v) for k, v in cfg.overrides.items()]
    trials = []
    for row in rows:
        extra = [_override(str(k), v) for k, v in row.values.items()]
        for seed in cfg.seeds:
            try:
                own = [f"seed={int(seed)}", f"name={slug(row.name)}-s{seed}"]
                run_cfg = load_config(base_tree, common + extra + own)
            except ConfigError as exc:
                raise ConfigError(f"sweep row {row.name!r}: {exc}") from exc
            trials.append(Trial(row.name, int(seed), to_dict(run_cfg)))
    return trials


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file; every trial's run config is built and validated."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {str(path)!r} does not exist. Pass a sweep YAML file, e.g. "
                          "configs/sweeps/vagent_ablation.yaml.")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}).") from exc
    cfg = from_mapping(SweepConfig, tree, where="sweep")
    _check_limits(cfg)
    base_tree = _base_tree(cfg, path)
    rows = expand_rows(cfg)
    baseline = cfg.baseline or rows[0].name
    if baseline not in [r.name for r in rows]:
        raise ConfigError(f"sweep baseline {baseline!r} is not a row; rows: {', '.join(r.name for r in rows)}.")
    return Sweep(cfg, rows, _trials(cfg, rows, base_tree), baseline)
