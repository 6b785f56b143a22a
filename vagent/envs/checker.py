"""The env checker: does an environment keep the contract of ``vagent.envs.base``?

``check_env(env_or_factory)`` raises :class:`EnvCheckError` at the first broken rule, with what
was expected, what was found and how to fix it, and returns a :class:`CheckReport` otherwise.
It checks (in this order):

1. the class declares ``Config`` (a dataclass, every field documented by a ``#:`` comment) and its
   module or class docstring (or a base class's) has the template sections (Action format,
   Observation, Rewards, Episode end, Arguments, Version);
2. ``step`` before ``reset`` raises ``EnvError``;
3. types: ``reset`` -> ``(Observation, dict)``, ``step`` -> ``StepResult`` with a finite float
   reward, bool ``terminated``/``truncated``, a dict ``info`` holding bool ``format_ok``,
   ``action_is_valid`` and ``success``; ``state()`` is a JSON-able dict; ``system_prompt()`` a
   non-empty str; images are RGB and one ``<image>`` placeholder stands for each (none with
   ``render="text"``, at least one with ``render="vision"``);
4. determinism: the same seed gives the same observation texts, image bytes, states, rewards and
   infos for a scripted reply sequence, twice on one instance, on a second instance (factory),
   and in a fresh Python process (envs made by ``make``: their ``spec_name``/``spec_config``; a
   ``RemoteEnv`` of an env registered only on its server: a new ``RemoteEnv`` on the same servers);
5. garbage replies (empty, random bytes, 1 MB, broken tags, unicode) never raise and report
   ``format_ok=False``;
6. an episode ends (terminated or truncated) and a further ``step`` raises ``EpisodeOverError``;
   ``reset`` works again afterwards; ``close()`` twice is fine.

The scripted replies use the env's solver (``optimal_actions``) when it has one, else cycle over
its ``action_names``, rendered in its reasoning format with ``formats.render_response``
(:mod:`vagent.envs.digest`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from vagent.config import field_docs
from vagent.envs.base import IMAGE_PLACEHOLDER, Env, EnvError, EpisodeOverError, Observation, StepResult
# the scripted episodes and their digests live beside this module; importable from here
from vagent.envs.digest import config_value, episode_digest, scripted_reply  # noqa: F401

DOCSTRING_SECTIONS = ("Action format", "Observation", "Rewards", "Episode end", "Arguments", "Version")
REQUIRED_INFO_BOOLS = ("format_ok", "action_is_valid", "success")


class EnvCheckError(AssertionError):
    """An environment broke the contract; the message says what and how to fix it."""


@dataclass
class CheckReport:
    """What ``check_env`` verified (``checks``) and what it could not or found suspicious."""

    env: str
    checks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _fail(env_name: str, what: str, fix: str) -> EnvCheckError:
    return EnvCheckError(f"[check_env {env_name}] {what}\n  How to fix: {fix}")


# ---------------------------------------------------------------------------------------------
# The digests of a fresh process (scripted episodes: vagent.envs.digest)
# ---------------------------------------------------------------------------------------------

_SUBPROCESS_CODE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
from vagent.envs import make
from vagent.envs.digest import episode_digest
urls = json.loads(sys.argv[6])
if urls:  # an env registered only on its server: a new RemoteEnv (token from VAGENT_SERVICE_TOKEN)
    from vagent.service.client import RemoteEnv
    env = RemoteEnv(urls, sys.argv[2], **json.loads(sys.argv[3]))
else:
    env = make(sys.argv[2], **json.loads(sys.argv[3]))
print(json.dumps([episode_digest(env, int(s), int(sys.argv[5])) for s in json.loads(sys.argv[4])]))
"""


def subprocess_digests(env_module: str, name: str, config: dict, seeds: list[int], n_steps: int,
                       remote: tuple[list[str], str | None] | None = None) -> list[str]:
    """The digests of ``seeds`` computed by a fresh Python process (its own hash salt).

    ``remote``: (server URLs, token) of an env that is registered only on its server: the fresh
    process makes a ``RemoteEnv`` there (a new session of the same servers) instead of ``make``.
    """
    urls, token = remote or ([], None)
    cmd = [sys.executable, "-c", _SUBPROCESS_CODE, env_module, name, json.dumps(config), json.dumps(seeds),
           str(n_steps), json.dumps(urls)]
    environ = {**os.environ, "VAGENT_SERVICE_TOKEN": token} if token else None  # not in argv: ps shows argv
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=environ)
    if proc.returncode != 0:
        raise EnvCheckError(
            f"[check_env {name}] the fresh-process run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}\n"
            f"  How to fix: `make('{name}', **{config!r})` must work in a new interpreter after importing "
            f"'{env_module}'; register the env at import time of that module or in vagent/envs/__init__.py."
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Individual checks
# ---------------------------------------------------------------------------------------------

def _check_declaration(env: Any, name: str, report: CheckReport) -> None:
    cls = type(env)
    cfg_cls = getattr(cls, "Config", None)
    if cfg_cls is None or not dataclasses.is_dataclass(cfg_cls):
        raise _fail(name, f"{cls.__name__} has no dataclass class attribute `Config`.",
                    "declare `Config = MyConfig` where MyConfig is a dataclass extending vagent.envs.EnvConfig.")
    docs = field_docs(cfg_cls)
    missing = [f.name for f in dataclasses.fields(cfg_cls) if not docs.get(f.name)]
    if missing:
        raise _fail(name, f"{cfg_cls.__name__} fields without documentation: {', '.join(missing)}.",
                    "put a `#: what it does` comment on the line above each field.")
    def _absent(klass: type) -> list[str]:
        module = sys.modules.get(klass.__module__)
        doc = ((module.__doc__ if module else "") or "") + (klass.__doc__ or "")
        return [s for s in DOCSTRING_SECTIONS if f"{s}:" not in doc]

    absent = _absent(cls)
    if absent and not any(not _absent(k) for k in cls.__mro__[1:] if k is not object):
        raise _fail(name, f"module {cls.__module__} docstring lacks the sections: {', '.join(absent)}.",
                    "start the env module with the template docstring (docs/custom_env.md): "
                    + ", ".join(f"'{s}:'" for s in DOCSTRING_SECTIONS) + ".")
    if not isinstance(env, Env):
        raise _fail(name, f"{cls.__name__} lacks a method of the Env protocol.",
                    "implement reset(seed), step(response), system_prompt(), state() and close().")
    report.checks.append("declaration: Config documented, docstring template, Env protocol")


def _check_observation(obs: Any, env: Any, name: str, where: str) -> None:
    if not isinstance(obs, Observation):
        raise _fail(name, f"{where} returned {type(obs).__name__} as the observation.",
                    "return vagent.envs.Observation(text, images).")
    n = obs.text.count(IMAGE_PLACEHOLDER)
    if n != len(obs.images):
        raise _fail(name, f"{where}: {n} '<image>' placeholder(s) but {len(obs.images)} image(s).",
                    "put exactly one '<image>' in the text per image, in order.")
    for im in obs.images:
        if im.mode != "RGB":
            raise _fail(name, f"{where}: an image has mode {im.mode!r}.", "convert it with image.convert('RGB').")
    render = config_value(env, "render", None)
    if render == "text" and obs.images:
        raise _fail(name, f"{where}: render='text' but the observation has {len(obs.images)} image(s).",
                    "with render='text' show the state as text only.")
    if render == "vision" and not obs.images:
        raise _fail(name, f"{where}: render='vision' but the observation has no image.",
                    "with render='vision' add the rendered frame and an '<image>' placeholder.")


def _check_state(env: Any, name: str, where: str) -> None:
    state = env.state()
    if not isinstance(state, dict):
        raise _fail(name, f"state() {where} returned {type(state).__name__}.", "return a dict.")
    try:
        json.dumps(state)
    except (TypeError, ValueError) as exc:
        raise _fail(name, f"state() {where} is not JSON-able: {exc}.",
                    "use lists, dicts, str, int, float and bool only (convert numpy values and tuples of cells).") from exc


def _check_step_result(res: Any, env: Any, name: str, where: str) -> None:
    if not isinstance(res, StepResult):
        raise _fail(name, f"{where} returned {type(res).__name__}.", "return vagent.envs.StepResult(obs, reward, terminated, truncated, info).")
    if not isinstance(res.reward, float) or isinstance(res.reward, bool) or not math.isfinite(res.reward):
        raise _fail(name, f"{where}: reward {res.reward!r} ({type(res.reward).__name__}) is not a finite float.",
                    "return float(reward).")
    for flag in ("terminated", "truncated"):
        tp = type(getattr(res, flag))
        if tp is not bool:
            raise _fail(name, f"{where}: {flag} is {tp.__module__}.{tp.__qualname__}, not the builtin bool.",
                        f"return bool({flag}) (numpy bools are not bool).")
    if not isinstance(res.info, dict):
        raise _fail(name, f"{where}: info is {type(res.info).__name__}.", "return a dict of diagnostics.")
    for key in REQUIRED_INFO_BOOLS:
        if type(res.info.get(key)) is not bool:
            raise _fail(name, f"{where}: info[{key!r}] is {res.info.get(key)!r}, expected a bool.",
                        f"report the documented metric keys {', '.join(REQUIRED_INFO_BOOLS)} as bools in info.")
    _check_observation(res.obs, env, name, where)


def _garbage_replies() -> list[str]:
    blob = bytes(range(256)) * 4
    return [
        "",
        blob.decode("latin-1"),
        blob.decode("utf-8", errors="replace"),
        "x" * 1_000_000,
        "<think><answer>up</think></answer>",
        "<answer>" * 50,
        "<think>\u2603\ud83d\ude00 \u4e2d\u6587</think><answer>\u2190\u2191</answer>\x00",
        "</answer>up<answer>",
    ]


def _check_garbage(env: Any, name: str, seed: int, report: CheckReport) -> None:
    env.reset(seed)
    for i, reply in enumerate(_garbage_replies()):
        try:
            res = env.step(reply)
        except Exception as exc:  # noqa: BLE001 - the point is to report any exception
            raise _fail(name, f"step(garbage reply #{i}, {reply[:30]!r}...) raised {type(exc).__name__}: {exc}",
                        "parse replies with vagent.envs.formats.parse_response (never raises) and treat a failed "
                        "format as an invalid turn.") from exc
        _check_step_result(res, env, name, f"step(garbage #{i})")
        if res.info["format_ok"] or res.info["action_is_valid"]:
            raise _fail(name, f"garbage reply #{i} ({reply[:30]!r}) was reported format_ok/action_is_valid.",
                        "set info['format_ok'] = parsed.format_ok and action_is_valid False on a failed format.")
        if res.terminated or res.truncated:
            env.reset(seed)
    report.checks.append(f"garbage replies ({len(_garbage_replies())}) never raise and fail the format")


def _check_end(env: Any, name: str, seed: int, max_end_steps: int, report: CheckReport) -> None:
    env.reset(seed)
    for turn in range(max_end_steps):
        res = env.step(scripted_reply(env, turn))
        _check_step_result(res, env, name, f"step (turn {turn})")
        _check_state(env, name, f"after step {turn}")
        if res.terminated or res.truncated:
            break
    else:
        raise _fail(name, f"the episode did not end within {max_end_steps} scripted steps.",
                    "truncate at a turn limit (a `max_steps` config field) with truncated=True.")
    _expect_error(name, lambda: env.step(scripted_reply(env, turn + 1)), EpisodeOverError,
                  "step after the end (terminated/truncated)",
                  "raise vagent.envs.EpisodeOverError('... call reset(seed)') when stepping a finished episode.")
    obs, _ = env.reset(seed)
    _check_observation(obs, env, name, "reset after the end")
    report.checks.append(f"episode ends within {turn + 1} turns; step after the end raises EpisodeOverError")


def _expect_error(name: str, call: Callable[[], Any], error: type[Exception], what: str, fix: str) -> None:
    """``call()`` (``what``: "step before reset") must raise ``error``; another exception, or none,
    fails the check with ``fix``."""
    try:
        call()
    except error:
        return
    except Exception as exc:  # noqa: BLE001
        raise _fail(name, f"{what} raised {type(exc).__name__} instead of {error.__name__}: {exc}", fix) from exc
    raise _fail(name, f"{what} did not raise {error.__name__}.", fix)


# ---------------------------------------------------------------------------------------------
def _server_only_source(env: Any, name: str) -> tuple[list[str], str | None] | None:
    """(URLs, token) of a remote env (``RemoteEnv.remote_source``) whose env is not registered in
    this process; None otherwise (the fresh process then compares with a local ``make``)."""
    from vagent.envs.registry import list_envs

    source = getattr(env, "remote_source", None)
    return source() if callable(source) and name not in list_envs() else None


def _check_step_before_reset(env: Any, name: str, report: CheckReport) -> None:
    """``step`` on a fresh env raises EnvError."""
    _expect_error(name, lambda: env.step("<answer>x</answer>"), EnvError,
                  "step before reset", "raise vagent.envs.EnvError('call reset(seed) first') when step comes before "
                  "reset (and pass a fresh env or a factory to check_env).")
    report.checks.append("step before reset raises EnvError")


def _check_reset(env: Any, name: str, seed: int, report: CheckReport) -> None:
    """``reset`` returns (Observation, dict), and ``state()`` and ``system_prompt()`` have their types."""
    obs, info = env.reset(seed)
    _check_observation(obs, env, name, "reset")
    if not isinstance(info, dict):
        raise _fail(name, f"reset returned info of type {type(info).__name__}.", "return (Observation, dict).")
    _check_state(env, name, "after reset")
    prompt = env.system_prompt()
    if not isinstance(prompt, str) or not prompt.strip():
        raise _fail(name, "system_prompt() is empty or not a str.", "return the rules, actions and format instruction.")
    report.checks.append("types of reset/state/system_prompt")


def _check_determinism(env: Any, factory: Callable[[], Any] | None, name: str, seeds: tuple[int, ...],
                       n_steps: int, report: CheckReport) -> dict[int, str]:
    """Each seed gives one episode on this instance (and on a second one from ``factory``); returns the digests."""
    digests = {s: episode_digest(env, s, n_steps) for s in seeds}
    again = {s: episode_digest(env, s, n_steps) for s in seeds}
    for s in seeds:
        if digests[s] != again[s]:
            raise _fail(name, f"seed {s} gave two different episodes on the same instance.",
                        "create all randomness in reset from numpy.random.default_rng(seed); keep no state across episodes.")
    report.checks.append(f"determinism on one instance (seeds {list(seeds)})")
    if factory is not None:
        other = factory()
        for s in seeds:
            if episode_digest(other, s, n_steps) != digests[s]:
                raise _fail(name, f"seed {s} gave different episodes on two instances.",
                            "draw the map in reset from the seed, not once in __init__ or from a global RNG.")
        other.close()
        report.checks.append("determinism across instances")
    if len(seeds) > 1 and len(set(digests.values())) == 1:
        report.warnings.append(f"seeds {list(seeds)} gave identical episodes: does the env use its seed?")
    return digests


def _check_fresh_process(env: Any, name: str, seeds: tuple[int, ...], n_steps: int, digests: dict[int, str],
                         report: CheckReport) -> None:
    """A fresh Python process gives the same ``digests``; a warning where it cannot make the env."""
    spec_name = getattr(env, "spec_name", None)
    module = type(env).__module__
    if spec_name is None:
        msg = "subprocess determinism skipped: the env was not made by vagent.envs.make (no spec_name)."
        warnings.warn(msg, stacklevel=3)  # at check_env's caller
        report.warnings.append(msg)
    elif module == "__main__":
        msg = "subprocess determinism skipped: the env class lives in __main__, which a fresh process cannot import."
        warnings.warn(msg, stacklevel=3)
        report.warnings.append(msg)
    else:
        fresh = subprocess_digests(module, spec_name, dict(env.spec_config), list(seeds), n_steps,
                                   _server_only_source(env, spec_name))
        for s, d in zip(seeds, fresh):
            if d != digests[s]:
                raise _fail(name, f"seed {s} gave a different episode in a fresh Python process.",
                            "avoid hash(), set iteration order, global RNGs and time-dependent values; "
                            "derive everything from numpy.random.default_rng(seed).")
        report.checks.append("determinism in a fresh process")


# The checker
# ---------------------------------------------------------------------------------------------

def check_env(env_or_factory: Any | Callable[[], Any], seeds: tuple[int, ...] = (0, 1), n_steps: int = 6,
              check_subprocess: bool = True, max_end_steps: int = 500) -> CheckReport:
    """Check an env (a fresh instance, or a zero-argument factory) against the contract.

    ``seeds``: the seeds of the determinism checks; ``n_steps``: scripted turns per digest
    episode; ``max_end_steps``: how long an episode may take to end. Raises EnvCheckError.
    """
    factory = None if hasattr(env_or_factory, "reset") else env_or_factory
    env = factory() if factory is not None else env_or_factory
    name = getattr(env, "spec_name", None) or type(env).__name__
    report = CheckReport(env=name)
    _check_declaration(env, name, report)
    _check_step_before_reset(env, name, report)
    _check_reset(env, name, seeds[0], report)
    digests = _check_determinism(env, factory, name, seeds, n_steps, report)
    _check_garbage(env, name, seeds[0], report)
    _check_end(env, name, seeds[0], max_end_steps, report)
    if check_subprocess:
        _check_fresh_process(env, name, seeds, n_steps, digests, report)
    env.close()
    env.close()
    report.checks.append("close() twice")
    return report
