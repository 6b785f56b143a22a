"""``vagent eval RUN_DIR``: evaluate a training run's checkpoint the way the run validated it.

A checkpoint's policy only makes sense on the envs it was trained on: the same render, image size,
description style and format. :func:`run_mapping` turns a run directory (or a checkpoint or
``policy/`` folder inside one) into an eval config mapping that repeats the run's validation:

- ``models``: the checkpoint's ``policy/`` folder, backend ``hf``, the run's ``model.dtype`` and
  ``model.max_context_tokens``; the newest checkpoint when a run directory is given;
- ``envs``: the run's ``envs`` entries with their ``config`` (``format`` moves to ``formats``)
  and the first ``n_val`` seeds of the ``val`` split each, the seeds validation uses;
- ``max_turns`` (``val.max_turns`` or ``rollout.max_turns``), ``mode`` and ``window`` of the
  rollout; ``sampling``: greedy, the run's ``max_new_tokens``, ``top_p``, ``top_k`` and stop
  strings (``rollout.stop`` plus the envs' own);
- ``out_dir``: ``RUN_DIR/eval/<checkpoint>``; ``imports``: the run's.

Flags and ``--config`` override any of these. :func:`env_mismatches` compares the eval envs with
the training envs of the run a checkpoint belongs to; the CLI prints each difference as a warning.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from vagent.config import ConfigError, to_dict


@dataclass(frozen=True)
class RunCheckpoint:
    """A training run directory and one checkpoint in it."""

    run_dir: Path
    #: the checkpoint folder, ``checkpoints/step_<6-digit RL step>`` (or ``sft_<6-digit SFT step>``)
    checkpoint: Path

    @property
    def policy_dir(self) -> Path:
        return self.checkpoint / "policy"

    @property
    def label(self) -> str:
        """A model label for outputs: ``<run dir name>-<checkpoint name>``."""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.run_dir.name}-{self.checkpoint.name}").strip("_")


def _run_root(path: Path) -> Path | None:
    """The run directory at or above ``path`` (a folder with config.yaml and checkpoints/), if any."""
    for p in (path, *path.parents[:3]):
        if (p / "config.yaml").is_file() and (p / "checkpoints").is_dir():
            return p
    return None


def find_checkpoint(path: str | Path) -> RunCheckpoint | None:
    """The run and checkpoint of ``path``: a run directory (its newest checkpoint whose policy/
    matches its manifest; a damaged newer one is named on stderr and skipped), a checkpoint folder,
    or a checkpoint's ``policy/`` folder (refused if its files do not match the manifest); None
    when ``path`` is not inside a run."""
    from vagent.runs.checkpoint import check_checkpoint, list_checkpoints

    p = Path(path).expanduser().resolve()
    root = _run_root(p)
    if root is None:
        return None
    if p == root:
        ckpts = [c for c in list_checkpoints(root / "checkpoints") if (c.path / "policy").is_dir()]
        if not ckpts:
            raise ConfigError(f"run {root} has no checkpoint with a policy/ folder in {root / 'checkpoints'}; "
                              "evaluate a run that saved one (log.checkpoint_every, or the end of training).")
        damaged = []
        for c in reversed(ckpts):
            problem = check_checkpoint(c.path, "policy/")
            if problem is None:
                return RunCheckpoint(root, c.path)
            damaged.append(f"{c.path.name}: {problem}")
            print(f"warning: checkpoint {c.path} is damaged ({problem}); evaluating an older one", file=sys.stderr)
        raise ConfigError(f"run {root} has no intact checkpoint: " + "; ".join(damaged) + ".")
    ckpt = p.parent if p.name == "policy" else p
    if ckpt.parent != root / "checkpoints":
        return None
    problem = check_checkpoint(ckpt, "policy/")
    if problem is not None:
        raise ConfigError(f"checkpoint {ckpt} is damaged: {problem}; evaluate another checkpoint of the run "
                          f"(vagent eval {root} takes the newest intact one).")
    return RunCheckpoint(root, ckpt)


def load_run_config(run_dir: Path, imports: Sequence[str] = ()) -> Any:
    """The run's saved config (``config.yaml``), validated; ConfigError names the file. A run
    directory is data: a config that imports modules (``imports``) is read only when ``imports``
    (the command's ``--import``) names each of them (:func:`vagent.recipes.consent.check_run_code`)."""
    from vagent.runconfig import load_config
    from vagent.recipes.consent import CodeConsent, check_run_code

    # eval never runs a model's own code (no trust_remote_code), so only the config's imports need consent
    check_run_code(run_dir / "config.yaml", CodeConsent(tuple(imports), trust_remote_code=True),
                   command=f"vagent eval {run_dir}")

    try:
        return load_config(run_dir / "config.yaml")
    except ConfigError as exc:
        raise ConfigError(f"{run_dir / 'config.yaml'}: {exc}") from exc


def _format_of(name: str, config: dict) -> str:
    from vagent.envs.registry import make_config

    return str(config.get("format") or make_config(name, **config).format)


def run_mapping(path: str | Path, imports: Sequence[str] = ()) -> tuple[dict[str, Any], RunCheckpoint]:
    """The eval config mapping that repeats the validation of the run at ``path`` (see the module
    docstring), and the run and checkpoint it evaluates. ConfigError if ``path`` is not a run."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"run directory {str(p)!r} does not exist; pass a training run directory "
                          "(runs/<name>-<timestamp>) or a checkpoint inside it.")
    rc = find_checkpoint(p)
    if rc is None:
        raise ConfigError(f"{p} is not a training run: expected a folder with config.yaml and checkpoints/ "
                          "(or a checkpoint inside one); for any other model directory use --backend hf --model DIR.")
    run = load_run_config(rc.run_dir, imports)
    from vagent.recipes.common import stop_strings

    envs, formats = [], []
    names = [e.name for e in run.envs]
    for i, e in enumerate(run.envs):
        if e.n_val <= 0:
            continue
        fmt = _format_of(e.name, e.config)
        formats += [fmt] if fmt not in formats else []
        envs.append({"name": e.name, "label": e.name if names.count(e.name) == 1 else f"{e.name}{i}",
                     "config": {k: v for k, v in e.config.items() if k != "format"}, "seeds": [f"val:{e.n_val}"]})
    if not envs:
        raise ConfigError(f"run {rc.run_dir} validates on no env (every envs.N.n_val is 0); pass --env and --seeds.")
    r = run.rollout
    mapping = {
        "models": [{"backend": "hf", "model": str(rc.policy_dir), "name": rc.label, "dtype": run.model.dtype,
                    "max_context_tokens": run.model.max_context_tokens or 0}],
        "envs": envs,
        "formats": formats,
        "max_turns": run.val.max_turns or r.max_turns,
        "mode": r.mode,
        "window": r.window,
        "sampling": {"temperature": 0.0, "top_p": r.top_p, "top_k": r.top_k, "max_new_tokens": r.max_new_tokens,
                     "stop": list(stop_strings(run)), "seed": run.seed},
        "out_dir": str(rc.run_dir / "eval" / rc.checkpoint.name),
        "imports": list(run.imports),
    }
    return mapping, rc


def env_mismatches(run: Any, envs: Sequence[Any], formats: Sequence[str]) -> list[str]:
    """One line per eval env (and format) whose resolved config matches none of the run's training
    entries of that env (every field, defaults included), naming the differing fields."""
    from vagent.envs.registry import make_config

    trained: dict[str, list[dict]] = {}
    for e in run.envs:
        trained.setdefault(e.name, []).append(to_dict(make_config(e.name, **e.config)))
    out = []
    for e in envs:
        if e.name not in trained:
            out.append(f"env {e.key}: the checkpoint was trained on {', '.join(trained)}, not {e.name}.")
            continue
        for fmt in formats:
            now = to_dict(make_config(e.name, **{**e.config, "format": fmt}))
            if any(now == t for t in trained[e.name]):
                continue
            t = trained[e.name][0]
            diff = ", ".join(f"{k} {now[k]!r} (eval) vs {t.get(k)!r} (training)" for k in now if now[k] != t.get(k))
            out.append(f"env {e.key} ({fmt}) is not the env the checkpoint was trained on: {diff}. "
                       "`vagent eval RUN_DIR` takes the run's env config; --env-config KEY=VALUE sets a field.")
    return out


__all__ = ["RunCheckpoint", "find_checkpoint", "load_run_config", "run_mapping", "env_mismatches"]
