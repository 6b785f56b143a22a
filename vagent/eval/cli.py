"""``vagent eval``: evaluate models on envs (see docs/evaluation.md).

    vagent eval runs/frozenlake-ppo-20250101-120000      # a training run's newest checkpoint, as it validated
    vagent eval runs/RUN/checkpoints/step_000010 --seeds test:100   # one checkpoint; flags override the run's
    vagent eval --config configs/eval_example.yaml [--force]
    vagent eval --backend openai --model gpt-4.1-mini --env frozenlake --seeds val:0-19 \\
                --format no_think,grounding_worldmodeling --out runs/eval/gpt41mini
    vagent eval --backend hf --model runs/ppo/checkpoints/step_000200/policy --env sokoban --seeds test:100
    vagent eval --describe         # every config field with its default and meaning
    vagent eval --backend hf --model MODEL_DIR --env corridor --import mypackage.corridor

``RUN_DIR`` (a training run, or a checkpoint or its ``policy/`` folder inside one) takes the run's
env entries (config, ``val`` seeds), turn limit, context mode and sampling (greedy, its token
limit and stop strings) and evaluates the checkpoint's policy with the ``hf`` backend into
``RUN_DIR/eval/<checkpoint>`` (``vagent.eval.from_run``); ``--config`` and the flags override them.
An ``hf`` model inside a training run whose eval env config differs from the run's gets a warning.

Quick flags override the config file: ``--model`` replaces its ``models`` (with ``--backend``,
``--base-url``, ``--concurrency``, ``--name``); without ``--model`` those three apply to every
configured model. ``--env`` (comma-separated) replaces ``envs``; ``--env-config KEY=VALUE``
(repeatable) sets an env config field on every env. ``--seeds`` and ``--format`` take
comma-separated lists.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from vagent.plugins import add_import_argument


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``eval`` command to an argparse subparsers object."""
    p = subparsers.add_parser("eval", help="evaluate local or API models on envs (resumable, summary + HTML)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", metavar="RUN_DIR",
                   help="a training run directory (its newest checkpoint) or a checkpoint inside one: evaluate it "
                        "on the run's envs, seeds and sampling (flags override them)")
    p.add_argument("--config", help="eval YAML (configs/eval_example.yaml)")
    p.add_argument("--model", help="model id (API) or local model directory (hf); replaces the config's models")
    p.add_argument("--backend", choices=("hf", "openai", "anthropic", "gemini"), help="backend of --model (default openai)")
    p.add_argument("--name", help="label of --model in outputs")
    p.add_argument("--base-url", help="API endpoint (default: OPENAI_BASE_URL / ANTHROPIC_BASE_URL / GEMINI_BASE_URL)")
    p.add_argument("--concurrency", type=int, help="requests in flight per model")
    p.add_argument("--env", help="env name(s), comma-separated; replaces the config's envs")
    p.add_argument("--env-config", action="append", default=[], metavar="KEY=VALUE",
                   help="env config field for every env (repeatable), e.g. render=text")
    p.add_argument("--seeds", help="seed ranges, comma-separated: val:0-19, test:100 (first 100), val:20+10")
    p.add_argument("--format", help="reasoning format(s), comma-separated")
    p.add_argument("--out", help="output directory (default runs/eval)")
    p.add_argument("--max-turns", type=int, help="turn limit per episode")
    p.add_argument("--group-size", type=int, help="episodes per seed")
    p.add_argument("--temperature", type=float, help="sampling temperature (0 = greedy)")
    p.add_argument("--max-new-tokens", type=int, help="tokens per reply")
    p.add_argument("--force", action="store_true", help="rerun finished episodes")
    p.add_argument("--no-html", action="store_true", help="do not write report.html")
    p.add_argument("--describe", action="store_true", help="print every config field and exit")
    add_import_argument(p)
    p.set_defaults(func=run)
    return p


def _scalar(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _apply_model_flags(m: dict[str, Any], args: argparse.Namespace) -> None:
    """``--model`` replaces the models; without it ``--backend``/``--base-url``/``--concurrency`` apply to each."""
    from vagent.config import ConfigError

    model_fields = {k: v for k, v in (("backend", args.backend), ("base_url", args.base_url),
                                      ("concurrency", args.concurrency)) if v is not None}
    if args.model:
        entry = {"backend": "openai", "model": args.model, **model_fields}
        if args.name:
            entry["name"] = args.name
        m["models"] = [entry]
    elif model_fields or args.name:
        if args.name:
            raise ConfigError("--name needs --model (it labels the model given on the command line).")
        m["models"] = [{**dict(x), **model_fields} for x in m.get("models", [])]


def _env_config_flags(items: Sequence[str]) -> dict[str, Any]:
    """The ``--env-config KEY=VALUE`` items as a mapping, each value read as a YAML scalar."""
    from vagent.config import ConfigError

    env_cfg = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--env-config {item!r}: expected KEY=VALUE, e.g. render=text.")
        k, v = item.split("=", 1)
        env_cfg[k.strip()] = _scalar(v)
    return env_cfg


def _apply_env_flags(m: dict[str, Any], args: argparse.Namespace) -> None:
    """``--env`` replaces the envs, ``--env-config`` sets fields on each, ``--seeds`` replaces every seed list."""
    env_cfg = _env_config_flags(args.env_config)
    if args.env:
        m["envs"] = [{"name": n, "config": dict(env_cfg)} for n in _csv(args.env)]
    elif env_cfg:
        m["envs"] = [{**dict(e), "config": {**dict(e.get("config", {})), **env_cfg}} for e in m.get("envs", [])]
    if args.seeds:
        m["seeds"] = _csv(args.seeds)
        m["envs"] = [{k: v for k, v in dict(e).items() if k != "seeds"} for e in m.get("envs", [])]


def build_mapping(args: argparse.Namespace) -> dict[str, Any]:
    """The config mapping: the YAML file (if any) with the quick flags applied."""
    from vagent.eval.config import load_yaml

    m: dict[str, Any] = {}
    base: dict[str, Any] = {}
    if getattr(args, "run", None):
        from vagent.eval.from_run import run_mapping

        base, rc = run_mapping(args.run, getattr(args, "imports", None) or ())
        m = dict(base)
    if args.config:
        m.update(load_yaml(args.config))
    _apply_model_flags(m, args)
    _apply_env_flags(m, args)
    if args.format:
        m["formats"] = _csv(args.format)
    for key, value in (("out_dir", args.out), ("max_turns", args.max_turns), ("group_size", args.group_size)):
        if value is not None:
            m[key] = value
    if getattr(args, "imports", None):
        m["imports"] = list(m.get("imports") or []) + [x for x in args.imports if x not in (m.get("imports") or [])]
    if args.force:
        m["force"] = True
    if args.no_html:
        m["html"] = False
    sampling = dict(m.get("sampling") or {})
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    if args.max_new_tokens is not None:
        sampling["max_new_tokens"] = args.max_new_tokens
    if sampling:
        m["sampling"] = sampling
    if base:
        m["training_run"] = {"run_dir": str(rc.run_dir), "checkpoint": rc.checkpoint.name,
                             "from_run": [k for k in base if m.get(k) == base[k]],
                             "overridden": [k for k in base if m.get(k) != base[k]]}
    return m


def check_training_envs(cfg: Any, imports: Sequence[str] = ()) -> None:
    """Warn (stderr, and ``cfg.training_run["warnings"]``) for each eval env that differs from the
    training env config of the run an hf model's directory belongs to."""
    from vagent.eval.from_run import env_mismatches, find_checkpoint, load_run_config

    lines = []
    for model in cfg.models:
        if model.backend != "hf" or not Path(model.model).expanduser().exists():
            continue
        rc = find_checkpoint(model.model)
        if rc is None:
            continue
        if not cfg.training_run:
            cfg.training_run = {"run_dir": str(rc.run_dir), "checkpoint": rc.checkpoint.name}
        for line in env_mismatches(load_run_config(rc.run_dir, imports), cfg.envs, cfg.formats):
            lines.append(f"model {model.label}: {line}")
            print(f"[eval] warning: {lines[-1]}", file=sys.stderr)
    if lines:
        cfg.training_run = {**cfg.training_run, "warnings": lines}


def _describe() -> None:
    from vagent.config import describe
    from vagent.eval.config import EvalConfig, EvalEnv, ModelSpec
    from vagent.rollout.policy import SamplingConfig

    for cls, title in ((EvalConfig, "eval config"), (EvalEnv, "envs[]"), (ModelSpec, "models[]"),
                       (SamplingConfig, "sampling")):
        print(f"{title}:")
        for name, tp, default, doc in describe(cls):
            print(f"  {name} ({tp}, default {default!r}): {doc}")


def _run_logged(cfg: Any) -> Any:
    """``run_eval(cfg)``; with an ``hf`` model, transformers' loading bars and Python's warnings go
    to ``<out_dir>/eval.log`` instead of the console (``vagent.runs.progress.library_output_to_file``)."""
    from vagent.eval.runner import run_eval

    if not any(m.backend == "hf" for m in cfg.models):  # API models only: no torch, nothing to route
        return run_eval(cfg)
    from vagent.runs.progress import library_output_to_file

    with library_output_to_file(Path(cfg.out_dir) / "eval.log"):
        return run_eval(cfg)


def run(args: argparse.Namespace) -> int:
    """Execute ``vagent eval``; returns the exit code (2 on a config error or a corrupt episode file,
    1 if episodes are missing or failed at the end, said in one line; else 0)."""
    from vagent.config import ConfigError

    if args.describe:
        _describe()
        return 0
    from vagent.eval.store import StoreError

    try:
        from vagent.eval.config import load_config

        cfg = load_config(build_mapping(args))
        check_training_envs(cfg, getattr(args, "imports", None) or ())
        from vagent.eval.runner import run_eval

        result = _run_logged(cfg)
    except (ConfigError, StoreError) as exc:
        print(f"vagent eval: {exc}", file=sys.stderr)
        return 2
    from vagent.eval.report import failure_line

    missing = sum(r["episodes"] - r["finished"] for r in result.summary["cells"])
    print(f"[eval] wrote {result.out_dir / 'summary.json'}"
          + (f" and {result.out_dir / 'report.html'}" if cfg.html else ""), file=sys.stderr)
    failed = failure_line(result.summary, result.first_error, cfg.retry_errors)
    if failed:  # an errored episode is not a result: the command failed (docs/evaluation.md, "Exit codes")
        print(failed, file=sys.stderr)
    return 1 if missing or failed else 0


__all__ = ["add_parser", "run", "build_mapping"]
