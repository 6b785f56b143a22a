"""``vagent train`` and ``vagent demos``.

    vagent train [--config FILE] [key=value section.key=value envs.0.config.render=text ...]
    vagent train --config base.yaml --config mine.yaml [key=value ...]   # files layered in order
    vagent train --resume RUN_DIR
    vagent train --describe                     # every config field with its default and doc
    vagent train --import mypackage.corridor envs.0.name=corridor ...   # your own env (docs/custom_env.md)
    vagent train --nproc 2 [key=value ...]      # a torchrun job of 2 processes (docs/distributed.md)
    vagent train --nproc 8 --nnodes 2 --node-rank R --rdzv-endpoint HOST:PORT [key=value ...]
    vagent demos ENV --format F --n N OUT [--random-action-frac 0.1] [--split train]
                 [--actions-per-turn K] [--objects goal hole] [--max-turns T] [--env key=value ...]
                 [--import MODULE]

``vagent train`` with no arguments runs the default preset (configs/frozenlake_ppo.yaml, embedded
in ``vagent.runconfig.DEFAULT_PRESET_YAML``): a tiny VLM warm-started with SFT on solver
demonstrations, then PPO with bi-level GAE on FrozenLake with image observations.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

import yaml

from vagent.config import ConfigError
from vagent.envs import make_config
from vagent.plugins import PluginImportError, add_import_argument, import_modules
from vagent.runconfig import RunConfig, describe_all
from vagent.startup import heavy_imports

if TYPE_CHECKING:
    from vagent.recipes.consent import CodeConsent
    from vagent.runs.rundir import RunDir


def add_parser(subparsers) -> None:
    _add_train_parser(subparsers)
    _add_demos_parser(subparsers)


def _add_train_parser(subparsers) -> None:
    train = subparsers.add_parser(
        "train", help="train a policy (PPO / GRPO / SFT); no arguments = the default FrozenLake run",
        description="Train a policy. Without --config the default preset runs (tiny VLM, SFT warm start, "
                    "PPO + bi-level GAE on FrozenLake with images).",
    )
    train.add_argument("overrides", nargs="*", metavar="key=value",
                       help="config overrides, e.g. steps=20 ppo.estimator=turn_gae envs.0.n_train=4")
    train.add_argument("--config", action="append", default=[], metavar="FILE",
                       help="YAML run config (presets in configs/); repeatable: the files are layered in order, "
                            "a later file's keys override an earlier one's (mappings merged, lists replaced)")
    train.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run from its newest checkpoint")
    train.add_argument("--describe", action="store_true", help="list every config field and exit")
    train.add_argument("--smoke", action="store_true",
                       help="the config at smoke scale: the tiny model and sizes capped by configs/paper/smoke.yaml, "
                            "every other setting kept (docs/paper.md)")
    train.add_argument("--quiet", action="store_true", help="print nothing (train.log still gets everything)")
    add_import_argument(train, also="added to the config's imports (saved with the run); with --resume, each "
                        "module the run's config imports must be named (a run directory is data); ")
    train.add_argument("--trust-remote-code", action="store_true",
                       help="with --resume: run the model directory's own Python files when the run's config has "
                            "model.trust_remote_code true (a run directory is data: its code runs only when you say so)")
    dist = train.add_argument_group("several processes (torchrun; docs/distributed.md)")
    dist.add_argument("--nproc", type=int, default=None, metavar="N",
                      help="processes on this host (GPUs: one per GPU); starts torchrun itself")
    dist.add_argument("--nnodes", type=int, default=1, metavar="N", help="hosts in the job (with --rdzv-endpoint)")
    dist.add_argument("--node-rank", type=int, default=None, metavar="R",
                      help="this host's rank among the nodes, 0..N-1 (torchrun's static rendezvous: global rank 0 "
                           "runs on node rank 0, the host of --rdzv-endpoint); without it torchrun's c10d rendezvous "
                           "numbers the hosts by sorted name")
    dist.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                      help="rendezvous address, the same on every host: node rank 0's address and a free port")
    train.set_defaults(func=run_train)


def _add_demos_parser(subparsers) -> None:
    demos = subparsers.add_parser(
        "demos", help="write solver demonstrations as SFT chat data (JSONL + PNG frames)",
        description="Play N episodes with the env's solver and write them in the SFT chat format, "
                    "with reasoning fields filled from the true state.",
    )
    demos.add_argument("env", help="registered env name (vagent envs lists them)")
    demos.add_argument("out", help="output JSONL file (images go to <out stem>_images/ next to it)")
    demos.add_argument("--format", default="grounding_worldmodeling", help="reasoning format")
    demos.add_argument("--n", type=int, default=64, help="episodes")
    demos.add_argument("--random-action-frac", type=float, default=None,
                       help="probability of replacing each solver action by a random one (default 0.1; 0 for "
                            "envs with free-form actions such as svg)")
    demos.add_argument("--split", default="train", choices=("train", "val", "test"), help="seed split")
    demos.add_argument("--offset", type=int, default=0, help="first seed's offset within the split")
    demos.add_argument("--actions-per-turn", type=int, default=None, help="actions per reply (default: the env's max)")
    demos.add_argument("--objects", nargs="*", default=(), help="describe only these object types (e.g. goal)")
    demos.add_argument("--reasoning-objects", nargs="*", default=(),
                       help="start <reasoning> with the relation of these object types (e.g. goal)")
    demos.add_argument("--no-reasoning-plan", action="store_true",
                       help="leave the plan sentence ('I move Down, Right.') out of <reasoning>")
    demos.add_argument("--max-turns", type=int, default=10, help="turn limit")
    demos.add_argument("--env", dest="env_config", nargs="*", default=(), metavar="key=value",
                       help="env config fields, e.g. render=text size=5")
    add_import_argument(demos)
    demos.set_defaults(func=run_demos)


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 1


def merge_trees(base: dict, top: dict) -> dict:
    """``top`` laid over ``base``: a key of both whose values are both mappings is merged the same
    way; any other value of ``top`` (a scalar, a list such as ``envs``) replaces ``base``'s."""
    out = dict(base)
    for key, value in top.items():
        out[key] = merge_trees(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def layered_config(files: list[str]) -> str | dict | None:
    """The config of ``--config A --config B ...``: None (the default preset) for no file, the path
    for one (``load_config`` reads it), else the files' mappings merged in order (:func:`merge_trees`:
    later keys override earlier ones). ConfigError names a missing, unreadable or non-mapping file."""
    if len(files) <= 1:
        return files[0] if files else None
    from pathlib import Path

    from vagent.runconfig.load import load_yaml
    from vagent.runconfig.ranges import read_config_text

    tree: dict = {}
    for name in files:
        path = Path(name)
        if not path.is_file():
            from vagent.runconfig.presets import missing_config_hint

            raise ConfigError(f"config file {name!r} does not exist.{missing_config_hint(name)}")
        try:
            layer = load_yaml(read_config_text(path), name) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{name}: not valid YAML ({exc}).") from exc
        if not isinstance(layer, dict):
            raise ConfigError(f"{name}: expected a mapping of config keys at the top level.")
        tree = merge_trees(tree, layer)
    return tree


def run_train(args: argparse.Namespace) -> int:
    if args.describe:
        print(describe_all())
        return 0
    if args.resume and args.config:  # overrides: the fields that may change on a resume (vagent.recipes.resume)
        return _error("--resume continues a run with its saved config.yaml; drop --config.")
    try:
        if args.resume:  # a run directory is data: the code its config names runs only when named here
            from pathlib import Path

            from vagent.recipes.consent import check_run_code

            check_run_code(Path(args.resume).expanduser() / "config.yaml", _consent(args))
        if args.resume and _finished(args):  # before torch, the launcher or any rank (rank 0 of a job says it)
            return 0
    except ConfigError as exc:  # overrides a finished run cannot take (steps=60), or an unknown key
        return _refused(_error(_in_job(str(exc))))
    if args.nproc is not None or args.nnodes > 1:
        return launch_job(args)
    try:  # the config first: a wrong key or value is said before torch and the recipes load (~6 s)
        cfg = None if args.resume else _run_config(args)
    except ConfigError as exc:
        return _refused(_error(_in_job(str(exc))))
    with heavy_imports():  # torch, transformers, the recipes: out of the garbage collector's walks (vagent/startup.py)
        from vagent.distributed import barrier, shutdown_world  # heavy (torch): `vagent --help` stays fast
        from vagent.recipes.sft import DataError  # heavy (torch)
        from vagent.runs import TrainingError

    try:
        _train(args, cfg)
        barrier("end of run")  # a job: every rank is done before any destroys the process group
        return 0
    except (ConfigError, DataError, TrainingError, FileNotFoundError, ImportError) as exc:
        from vagent.runs.checkpoint import CheckpointError

        code = _error(_in_job(str(exc)))
        return _refused(code) if isinstance(exc, (ConfigError, CheckpointError)) else code
    finally:
        shutdown_world()  # every exit path (a gloo job that skips it aborts about 1 exit in 3)


def _consent(args: argparse.Namespace) -> "CodeConsent":
    """The code a ``--resume`` command line vouches for: its ``--import`` modules, ``--trust-remote-code``."""
    from vagent.recipes.consent import CodeConsent

    return CodeConsent(tuple(args.imports), bool(getattr(args, "trust_remote_code", False)))


def _finished(args: argparse.Namespace) -> bool:
    """``--resume`` of a finished run (its config.yaml and summary.json there): said once (rank 0 of
    a job), before torch loads; ConfigError for overrides it cannot take (``steps=60``: a finished
    run does not train again). Anything else is left to the run's own checks."""
    from pathlib import Path

    from vagent.recipes.finished import finished

    root = Path(args.resume).expanduser()
    return (root / "config.yaml").is_file() and finished(root, args.quiet or os.environ.get("RANK", "0") != "0",
                                                         args.overrides)


def _refused(code: int) -> int:
    """A rank of a job launched by ``vagent train --nproc`` that refuses to run (its config or its
    checkpoint: nothing a rerun of the same command changes) exits ``REFUSED_EXIT``, so the
    launcher's failure line does not recommend that command again; any other process: ``code``."""
    from vagent.exit_codes import LAUNCHER_PID_ENV, REFUSED_EXIT

    return REFUSED_EXIT if os.environ.get(LAUNCHER_PID_ENV) else code


def _in_job(msg: str) -> str:
    """``msg`` with this rank's tag in a torchrun job (``rank 0/2: ...``), as it is in one process."""
    if "WORLD_SIZE" not in os.environ:
        return msg
    from vagent.distributed import world  # heavy (torch)

    return f"{world().tag()}: {msg}" if world().distributed else msg


def _run_config(args: argparse.Namespace) -> RunConfig:
    """The config of ``train``: the ``--import`` modules (imported before the config's envs are
    checked; saved in the config for --resume), the config files and overrides, the one-process
    checks. Light: no torch."""
    if args.imports:
        try:
            import_modules(args.imports)
        except PluginImportError as exc:
            raise ConfigError(f"--import: {exc}") from exc
    from vagent.recipes.scale import load_scaled, preflight

    cfg = load_scaled(layered_config(args.config), args.overrides, args.smoke)
    if "WORLD_SIZE" not in os.environ:  # one process; a job was checked by its launcher (launch_job)
        from vagent.rollout.driver import check_rollout_setup

        check_rollout_setup(cfg.rollout, distributed=False)  # Ray / vLLM missing: said before torch loads
        preflight(cfg, 1)
    cfg.imports += [m for m in args.imports if m not in cfg.imports]
    return cfg


def _train(args: argparse.Namespace, cfg: RunConfig | None) -> None:
    """``train`` of ``--resume RUN_DIR`` (``cfg`` None), or of ``cfg`` (:func:`_run_config`)."""
    with heavy_imports():
        from vagent.recipes.run import train  # heavy (torch, the recipes)
        from vagent.runs.progress import ConfigSource

    if cfg is None:
        train(resume=args.resume, quiet=args.quiet, overrides=args.overrides, consent=_consent(args))
        return
    # several files: the summary lists the keys that differ from the default preset; --smoke's values apart
    from vagent.recipes.scale import applied_smoke

    source = ConfigSource(args.config[0] if len(args.config) == 1 else None, tuple(args.overrides),
                          applied_smoke(layered_config(args.config), args.smoke))
    train(cfg, quiet=args.quiet, source=source)


def launch_job(args: argparse.Namespace) -> int:
    """``vagent train --nproc N ...``: the same command as a torchrun job (vagent.distributed.launch).
    The config is checked before torch loads (a wrong key is said at once, as in one process)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # vagent.distributed.launched_by_torchrun, without torch
        return _error("--nproc/--nnodes start a torchrun job; this process already is a worker of one "
                      "(drop them when you run torchrun yourself).")
    run_dir, cfg = None, None
    if args.resume:  # before starting any process: a live job's run directory (a finished one: run_train)
        from vagent.runs import TrainingError, existing_run_dir  # light: vagent.runs loads its pieces on first use
        from vagent.runs.lock import check_unlocked

        try:
            run = existing_run_dir(args.resume)
            check_unlocked(run.root)  # RunDirLocked, a TrainingError
            check_job_resume(run, args.overrides, (args.nproc or 1) * args.nnodes, _consent(args))
        except (FileNotFoundError, TrainingError, ConfigError) as exc:
            return _error(str(exc))
        run_dir = str(run.root)
    if not args.resume:  # the checks of one process, once, before torchrun starts any rank
        from vagent.runconfig.ranges import check_out_dir
        from vagent.recipes.scale import load_scaled, preflight
        from vagent.rollout.driver import check_rollout_setup

        try:
            import_modules(args.imports)  # the config's own envs, as _train does
            cfg = load_scaled(layered_config(args.config), args.overrides, args.smoke)
            check_out_dir(cfg.out_dir)
            check_rollout_setup(cfg.rollout, (args.nproc or 1) * args.nnodes > 1)
            # a recipe written for N GPUs: model downloaded? the share per GPU, memory
            preflight(cfg, (args.nproc or 1) * args.nnodes)
        except (ConfigError, PluginImportError) as exc:
            return _error(str(exc))
    with heavy_imports():
        from vagent.distributed.launch import launch  # heavy (torch)

    train_args = list(args.overrides)
    if args.smoke:
        train_args.append("--smoke")
    for file in args.config:
        train_args += ["--config", file]
    if args.resume:
        train_args += ["--resume", args.resume]
    if args.quiet:
        train_args.append("--quiet")
    for module in args.imports:
        train_args += ["--import", module]
    if args.trust_remote_code:
        train_args.append("--trust-remote-code")
    try:
        return launch(args.nproc or 1, train_args, nnodes=args.nnodes, node_rank=args.node_rank,
                      rdzv_endpoint=args.rdzv_endpoint, run_dir=run_dir,
                      out_dir=cfg.out_dir if cfg is not None else None, run_name=cfg.name if cfg is not None else None)
    except ValueError as exc:
        return _error(str(exc))


def check_job_resume(run: RunDir, overrides: list[str], ranks: int, consent: "CodeConsent | None" = None) -> None:
    """Before a job of ``ranks`` processes starts on ``--resume RUN``: its config and overrides pass
    (:func:`vagent.recipes.resume.resume_config`, which writes nothing), and the newest checkpoint
    suits the job (:func:`vagent.recipes.resume.check_resumable`: one written by one process in a
    job of several, ``steps`` below its step). One line; rank 0 checks the checkpoint it resumes
    from again (a damaged newest one falls back)."""
    from vagent.recipes.resume import check_resumable, resume_config  # heavy (torch)
    from vagent.runs.checkpoint import list_checkpoints

    plan = resume_config(run, overrides, *([consent] if consent is not None else []))
    for newest in list_checkpoints(run.checkpoints)[-1:]:
        check_resumable(run, newest, plan, ranks)


def run_demos(args: argparse.Namespace) -> int:
    from vagent.recipes.demos import DemoSettings, default_random_frac, write_demos  # heavy (numpy)

    try:
        import_modules(args.imports)
        frac = args.random_action_frac if args.random_action_frac is not None else default_random_frac(args.env)
    except (PluginImportError, KeyError) as exc:
        return _error(str(exc).strip("'\""))
    env_config = {"format": args.format}
    for item in args.env_config:
        if "=" not in item:
            return _error(f"--env {item!r}: expected key=value (e.g. render=text).")
        k, _, v = item.partition("=")
        env_config[k] = yaml.safe_load(v)
    settings = DemoSettings(env=args.env, env_config=env_config, n=args.n, split=args.split, offset=args.offset,
                            random_action_frac=frac, actions_per_turn=args.actions_per_turn,
                            max_turns=args.max_turns, objects=tuple(args.objects),
                            reasoning_objects=tuple(args.reasoning_objects),
                            reasoning_plan=not args.no_reasoning_plan)
    try:
        make_config(args.env, **env_config)
        summary = write_demos(settings, args.out)
    except (ConfigError, KeyError, ValueError, TypeError) as exc:
        return _error(str(exc).strip("'\""))
    print(f"wrote {summary['episodes']} demonstrations ({summary['turns']} turns, solver success "
          f"{summary['success_rate']:.2f}) to {summary['path']}")
    return 0
