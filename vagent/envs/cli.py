"""``vagent envs`` (list envs and their config fields) and ``vagent play`` (play an episode).

``vagent play ENV --policy human|random|solver`` prints each observation, the reply, its parsed
fields and the reward; the images of a vision env are written as PNG files whose paths are printed
where the ``<image>`` placeholder stands (``--image-dir``, or a temporary folder for a human
player); ``--save-dir`` writes every image frame as PNG, an animated GIF of the
episode and ``episode.json`` (replies, rewards, infos, states). The solver policy writes replies
in the chosen format with true state descriptions (``vagent.rollout.scripted.solver_reply``).
A human may type a whole reply or just the actions (``up,left``), which are then wrapped in the
format with placeholder fields.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from vagent.plugins import add_import_argument

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

    from vagent.envs.base import Observation, StepResult


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("envs", help="list registered environments and their config fields")
    p.add_argument("name", nargs="?", help="show only this env")
    add_import_argument(p)
    p.set_defaults(func=cmd_envs)

    q = subparsers.add_parser("play", help="play an episode of an environment in the terminal")
    q.add_argument("env", help="registered env name (see `vagent envs`)")
    q.add_argument("--seed", type=int, default=0, help="episode seed (default 0)")
    q.add_argument("--format", default=None, help="reasoning format (default: the env's)")
    q.add_argument("--policy", choices=("human", "random", "solver"), default="human",
                   help="who replies: human (you type a reply, or just the actions, e.g. up,left), random (random "
                        "actions) or solver (the env's optimal actions with true state descriptions); default human")
    q.add_argument("--render", choices=("vision", "text"), default=None, help="observation render (default: the env's)")
    q.add_argument("--save-dir", default=None, help="write frames (PNG), episode.gif and episode.json here")
    q.add_argument("--image-dir", default=None,
                   help="write each turn's observation images here as PNG and print their paths (a human player "
                        "of a vision env gets a new temporary folder when this is not given)")
    q.add_argument("--max-turns", type=int, default=100, help="stop after this many turns (default 100)")
    q.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                   help="env config overrides; values are YAML (e.g. dim_room=[8,8] num_boxes=2)")
    add_import_argument(q)
    q.set_defaults(func=cmd_play)


def import_plugins(args: argparse.Namespace) -> bool:
    """Import the modules of ``--import``; False after printing the error when one cannot be imported."""
    from vagent.plugins import PluginImportError, import_modules

    try:
        import_modules(getattr(args, "imports", ()))
    except PluginImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    return True


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["a=1", "b=[2,3]"]`` -> ``{"a": 1, "b": [2, 3]}`` (values parsed as YAML)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--config expects KEY=VALUE items, got {item!r} (e.g. --config num_boxes=2).")
        out[key.strip()] = yaml.safe_load(value)
    return out


def cmd_envs(args: argparse.Namespace) -> int:
    from vagent.config import describe
    from vagent.envs import env_class, list_envs

    if not import_plugins(args):
        return 2
    names = [args.name] if args.name else list_envs()
    for name in names:
        try:
            cls = env_class(name)
        except KeyError as exc:
            print(f"error: {exc.args[0]}", file=sys.stderr)
            return 2
        module_doc = (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
        print(f"{name}: {module_doc[0] if module_doc else cls.__name__}")
        print(f"  class {cls.__module__}:{cls.__name__}")
        for field, tp, default, doc in describe(cls.Config):
            print(f"  {field} ({tp}, default {default!r}): {doc}")
        print()
    return 0


def _human_reply(env: Any) -> str:
    from vagent.envs.formats import render_response

    text = input("your reply (or just actions, e.g. up,left; empty to quit)> ").strip()
    if not text:
        raise EOFError
    if "<" in text:
        return text
    filler = "typed by a human"
    return render_response(env.config.format, {"think": filler, "observation": filler, "reasoning": filler,
                                               "prediction": filler, "answer": text})


def _random_reply(env: Any, rng: np.random.Generator) -> str:
    from vagent.envs.formats import render_response

    names = list(getattr(env, "action_names", ()))
    draw = getattr(env, "random_action", None)  # an env whose actions take arguments (primitive_skill)
    if not names and not callable(draw):
        raise SystemExit(f"{type(env).__name__} has no action_names; the random policy needs them.")
    n = int(rng.integers(1, env.config.max_actions_per_turn + 1))
    actions = [draw(rng) if callable(draw) else names[int(rng.integers(len(names)))] for _ in range(n)]
    filler = "a random move"
    return render_response(env.config.format, {"think": filler, "observation": filler, "reasoning": filler,
                                               "prediction": filler, "answer": getattr(env, "action_sep", ",").join(actions)})


def _save_episode(save_dir: Path, frames: list, log: list[dict]) -> None:
    save_dir.mkdir(parents=True, exist_ok=True)
    for i, frame in enumerate(frames):
        frame.save(save_dir / f"frame_{i:03d}.png")
    if frames:
        frames[0].save(save_dir / "episode.gif", save_all=True, append_images=frames[1:], duration=500, loop=0)
    (save_dir / "episode.json").write_text(json.dumps(log, indent=1, default=repr))
    print(f"saved {len(frames)} frame(s){', episode.gif' if frames else ''} and episode.json to {save_dir}")


def _image_dir(args: argparse.Namespace, obs: Observation) -> Path | None:
    """Where the observation images go: ``--image-dir``; for a human facing images, a new temporary
    folder (a terminal shows only the ``<image>`` placeholder); else nowhere."""
    import tempfile

    if args.image_dir:
        return Path(args.image_dir)
    if args.policy == "human" and obs.images:
        return Path(tempfile.mkdtemp(prefix=f"vagent-play-{args.env}-"))
    return None


def _show_images(images: Sequence[Image.Image], image_dir: Path | None, stem: str) -> None:
    """Write ``images`` as ``<stem>_<i>.png`` under ``image_dir`` and print where each is."""
    if image_dir is None or not images:
        return
    image_dir.mkdir(parents=True, exist_ok=True)
    for i, im in enumerate(images):
        path = image_dir / f"{stem}_{i}.png"
        im.save(path)
        print(f"[<image> {i + 1} of {len(images)}: {path}]")


def _make_play_env(args: argparse.Namespace) -> Any | None:
    """The env ``vagent play`` asked for, or None after printing why it cannot be made (or solved)."""
    from vagent.config import ConfigError
    from vagent.envs import make

    config = parse_overrides(args.config)
    if args.format:
        config["format"] = args.format
    if args.render:
        config["render"] = args.render
    try:
        env = make(args.env, **config)
    except (ConfigError, KeyError) as exc:
        print(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return None
    if args.policy == "solver" and not callable(getattr(env, "optimal_actions", None)):
        print(f"error: env '{args.env}' has no solver (optimal_actions); use --policy human or random.", file=sys.stderr)
        return None
    return env


def _policy_reply(env: Any, policy: str, rng: np.random.Generator) -> str | None:
    """The next reply of ``policy`` (human, random or solver); None when the human quits (end of input)."""
    if policy == "solver":
        from vagent.rollout.scripted import solver_reply

        return solver_reply(env)
    if policy == "random":
        return _random_reply(env, rng)
    try:
        return _human_reply(env)
    except EOFError:
        return None


def _print_step(env: Any, reply: str, res: StepResult, total: float) -> None:
    """Print a reply, its parsed fields, the reward with the return so far, and the info."""
    from vagent.envs.formats import parse_response

    parsed = parse_response(reply, env.config.format, getattr(env, "action_sep", ","), env.config.max_actions_per_turn)
    print(f"--- reply ---\n{reply}")
    for name in ("observation", "reasoning", "prediction", "answer"):
        if getattr(parsed, name):
            print(f"  {name}: {getattr(parsed, name)}")
    print(f"  reward {res.reward:+.3f} (return {total:+.3f})  terminated={res.terminated} truncated={res.truncated}")
    print(f"  info {json.dumps(res.info, default=repr)}")


def cmd_play(args: argparse.Namespace) -> int:
    import numpy as np

    if not import_plugins(args):
        return 2
    env = _make_play_env(args)
    if env is None:
        return 2
    rng = np.random.default_rng(args.seed)
    print("=== system prompt ===\n" + env.system_prompt())
    obs, _ = env.reset(args.seed)
    image_dir = _image_dir(args, obs)
    frames, log, total, res = list(obs.images), [], 0.0, None
    for turn in range(args.max_turns):
        print(f"\n=== turn {turn} observation ===\n{obs.text}")
        _show_images(obs.images, image_dir, f"turn_{turn:03d}")
        reply = _policy_reply(env, args.policy, rng)
        if reply is None:
            print("quit")
            break
        state_before = env.state()
        res = env.step(reply)
        total += res.reward
        _print_step(env, reply, res, total)
        log.append({"turn": turn, "reply": reply, "reward": res.reward, "terminated": res.terminated,
                    "truncated": res.truncated, "info": res.info, "state_before": state_before,
                    "state_after": env.state(), "observation": obs.text})
        obs = res.obs
        frames += list(obs.images)
        if res.terminated or res.truncated:
            break
    if res is not None and (res.terminated or res.truncated):
        _show_images(obs.images, image_dir, "final")
    success = bool(res is not None and res.info.get("success"))
    print(f"\n=== episode over: success={success} return={total:+.3f} turns={len(log)} ===")
    if args.save_dir:
        _save_episode(Path(args.save_dir), frames, log)
    env.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Only the env commands (``python -m vagent.envs.cli``): no other subsystem is imported."""
    parser = argparse.ArgumentParser(prog="vagent", description="vagent env commands")
    add_parser(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
