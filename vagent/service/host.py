"""Where the envs live: a table of sessions and the operations on them, run off the event loop.

:class:`SessionHost` owns env instances and runs one operation at a time on them
(create / reset / step / system_prompt / state / optimal_actions / close), encoding observation
images to PNG on the spot. The HTTP front (:mod:`vagent.service.server`) runs a host either in
its own thread pool (``--workers 1``) or in each of W worker processes (``--workers W``), where
:func:`worker_main` reads operations from a pipe.

An operation returns ``("ok", payload)`` or ``("err", status, ErrorBody-dict)``; a payload is
JSON-able except that observation images are ``bytes`` in ``{"images": [...]}`` (in the codec
the request asked for: PNG, raw pixels or zlib, see vagent/service/protocol.py, with their
``formats``), which the front turns into binary frame parts. Env exceptions never become rewards: ``reset``/``step``
that raise close the session (its state is unknown) and answer 500 with the error text; the
read-only operations answer 500 and keep it. A ``ConfigError`` (at creation, or at a reset that
cannot build an episode from the config) answers 422.

Policy on env configs (vagent/envs/limits.py): a client may not set an env's server-only fields
(files, modules, simulator processes, sandbox limits; 422 naming the operator's flag); the
operator's ``--env-config`` values are merged under every client config; every config passes the
env's bounds in ``make``. Nothing the operator configured leaves the server: server-only fields
are left out of the session spec, and error texts have the operator's values and absolute paths
replaced (:meth:`SessionHost.redact`).
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from vagent.config import ConfigError, to_dict
from vagent.envs.base import Env, EnvError, EpisodeOverError, Observation, StepResult
from vagent.service.protocol import config_hash as config_hash_of
from vagent.service.protocol import encode_image

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

Result = tuple  # ("ok", payload) | ("err", status, {"error", "detail", "session_closed"})


def import_plugins(modules: tuple[str, ...] | list[str]) -> None:
    """Import modules that register envs, as every other command does (:func:`vagent.plugins.import_modules`:
    a dotted name found from the current folder or ``sys.path``, or the path of a ``.py`` file);
    raises :class:`vagent.plugins.PluginImportError` naming the fix."""
    from vagent.plugins import import_modules

    import_modules(modules)


def to_jsonable(x: object) -> Any:
    """JSON-able copy of ``x``: numpy scalars/arrays become numbers/lists, tuples lists, other
    unknown objects their ``str`` (``info`` is diagnostics; documented in docs/service.md)."""
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if hasattr(x, "tolist"):  # numpy scalar or array
        return to_jsonable(x.tolist())
    return str(x)


def env_spec(env: Env, hidden: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a client needs to mirror a local env: its resolved config (without the ``hidden``
    server-only fields), action names and separator, and its judge spec (the checker and the
    reasoning judges read these)."""
    cfg = getattr(env, "config", None)
    judge = getattr(env, "judge_spec", None)
    config = to_jsonable(to_dict(cfg)) if dataclasses.is_dataclass(cfg) else {}
    return {
        "config": {k: v for k, v in config.items() if k not in hidden},
        "action_names": [str(a) for a in (getattr(env, "action_names", ()) or ())],
        "action_sep": str(getattr(env, "action_sep", ",")),
        "reply_stop": [str(x) for x in getattr(env, "reply_stop", ()) or ()],
        "judge_spec": to_jsonable(dataclasses.asdict(judge)) if dataclasses.is_dataclass(judge) else None,
    }


def env_info(name: str, allowed: tuple[str, ...] = ()) -> Result:
    """``GET /v1/envs/{name}``: what a client needs about env class ``name`` before any session
    (protocol.EnvInfoOut): description, ``reply_stop``, actions, the config fields a client may set."""
    import sys

    from vagent.config import describe
    from vagent.envs.limits import server_only_fields
    from vagent.envs.registry import env_class

    if allowed and name not in allowed:
        return _err(422, "UnknownEnv", f"env '{name}' is not served here; served: {', '.join(allowed)}.")
    try:
        cls = env_class(name)
    except KeyError as exc:
        return _err(422, "UnknownEnv", str(exc.args[0]))
    doc = (getattr(sys.modules.get(cls.__module__), "__doc__", None) or cls.__doc__ or "").strip().splitlines()
    hidden = server_only_fields(cls)
    fields = [{"name": f, "type": tp, "default": to_jsonable(default), "doc": d}
              for f, tp, default, d in describe(cls.Config) if f not in hidden]
    return ("ok", {"name": name, "description": doc[0] if doc else cls.__name__,
                   "reply_stop": [str(x) for x in getattr(cls, "reply_stop", ()) or ()],
                   "action_names": [str(a) for a in getattr(cls, "action_names", ()) or ()],
                   "action_sep": str(getattr(cls, "action_sep", ",")), "config_fields": fields})


def _err(status: int, kind: str, detail: str, closed: bool = False) -> Result:
    return ("err", status, {"error": kind, "detail": detail, "session_closed": closed})


_ABS_PATH = re.compile(r"(?<![\w.:/])/(?:[^\s'\"()<>,;:]+/)+[^\s'\"()<>,;:]*")


def _exc_text(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)[-3:]
    where = "; ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in tb)
    return f"{type(exc).__name__}: {exc} (at {where})"


@dataclass
class _Session:
    env: Any
    name: str
    #: steps applied since the last reset, and the payload of the last one (for retried steps)
    steps: int = 0
    last: dict | None = None
    info: dict = field(default_factory=dict)


class SessionHost:
    """The env instances of one process and the operations on them (one at a time per session).

    ``allowed``: env names that may be created (empty: every registered env).
    ``png_level``: zlib level of the PNG encoder (lossless at any level).
    ``env_config``: the operator's config per env name (``--env-config``), merged under every
    client config; the only way server-only fields are set.
    """

    def __init__(self, allowed: tuple[str, ...] = (), png_level: int = 1,
                 env_config: dict[str, dict[str, Any]] | None = None) -> None:
        self.allowed = tuple(allowed)
        self.png_level = png_level
        self.env_config = {k: dict(v) for k, v in (env_config or {}).items()}
        self.sessions: dict[str, _Session] = {}
        # path- or module-like operator values (svg_dir, data, env_kwargs' files...) are redacted from errors
        secrets = {s for cfg in self.env_config.values() for s in _strings(cfg) if len(s) >= 3 and any(c in s for c in "/.:\\")}
        self._secrets = sorted(secrets, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """``text`` with the operator's config values and absolute paths replaced: error texts go
        to clients, and server paths never leave the server."""
        for s in self._secrets:
            text = text.replace(s, "<server-config>")
        return _ABS_PATH.sub("<server-path>", text)

    # -- encoding
    def _obs(self, obs: Observation) -> dict:
        """An observation for a payload: its images stay PIL images until :meth:`_encode`."""
        if not isinstance(obs, Observation):
            raise TypeError(f"the env returned {type(obs).__name__} where an Observation was expected")
        return {"text": obs.text, "images": list(obs.images)}

    def _encode(self, x: object, codec: str) -> Any:
        """A copy of payload ``x`` whose observation images are bytes in ``codec`` (with
        ``formats`` unless PNG); stored payloads (a retried step's) keep their PIL images."""
        if isinstance(x, dict):
            ims = x.get("images")
            if isinstance(ims, list) and ims and all(isinstance(im, Image.Image) for im in ims):
                parts = [encode_image(im, codec, self.png_level) for im in ims]
                out = {**x, "images": [p for p, _ in parts]}
                if codec != "png":
                    out["formats"] = [f for _, f in parts]
                return out
            return {k: self._encode(v, codec) for k, v in x.items()}
        if isinstance(x, list):
            return [self._encode(v, codec) for v in x]
        return x

    def _step_payload(self, res: StepResult) -> dict:
        if not isinstance(res, StepResult):
            raise TypeError(f"step returned {type(res).__name__} where a StepResult was expected")
        reward = float(res.reward)
        if not math.isfinite(reward):
            raise ValueError(f"step returned a non-finite reward {res.reward!r}")
        return {
            "obs": self._obs(res.obs),
            "reward": reward,
            "terminated": bool(res.terminated),
            "truncated": bool(res.truncated),
            "info": to_jsonable(res.info),
        }

    def _reset_payload(self, out: tuple[Observation, dict]) -> dict:
        obs, info = out
        return {"obs": self._obs(obs), "info": to_jsonable(info)}

    # -- dispatch
    def run(self, op: tuple, codec: str = "png") -> Result:
        """Run one operation ``(name, session_id, *args)``, images in ``codec``; never raises."""
        res = self._run(op)
        if res[0] != "ok":
            return res
        try:
            return ("ok", self._encode(res[1], codec))
        except Exception as exc:  # noqa: BLE001 - e.g. an image PIL cannot encode: the env's fault
            return _err(500, "EnvException", self.redact(f"encoding the observation failed: {_exc_text(exc)}"))

    def _run(self, op: tuple) -> Result:
        name, sid, *args = op
        fn = getattr(self, f"_op_{name}", None)
        if fn is None:
            return _err(422, "ValidationError", f"unknown operation {name!r}")
        if name != "create" and sid not in self.sessions:
            return _err(404, "UnknownSession", _unknown(sid))
        try:
            return fn(sid, *args)
        except EpisodeOverError as exc:
            return _err(409, "EpisodeOverError", self.redact(str(exc)))
        except EnvError as exc:
            return _err(409, "EnvError", self.redact(str(exc)))
        except Exception as exc:  # noqa: BLE001 - an env bug: reported, never a reward
            closed = name in ("reset", "step", "create")
            if closed and sid in self.sessions:
                self._close(sid)
            if isinstance(exc, ConfigError):  # e.g. no episode can be generated from this config
                return _err(422, "ConfigError", self.redact(str(exc)), closed)
            return _err(500, "EnvException", self.redact(f"env raised in {name}: {_exc_text(exc)}"), closed)

    def run_many(self, ops: list[tuple], codec: str = "png") -> list[Result]:
        return [self.run(op, codec) for op in ops]

    # -- operations
    def _op_create(self, sid: str, env_name: str, config: dict, seed: int | None, replay: list[str],
                   config_hash: str | None = None) -> Result:
        from vagent.envs.limits import server_only_fields
        from vagent.envs.registry import env_class, list_envs, make

        if self.allowed and env_name not in self.allowed:
            return _err(422, "UnknownEnv", f"env '{env_name}' is not served here; served: {', '.join(self.allowed)}.")
        try:
            env_class(env_name)  # unknown names: 422 with the registry's 'did you mean'
        except KeyError as exc:
            return _err(422, "UnknownEnv", str(exc.args[0]) if exc.args else f"unknown env {env_name!r}; {list_envs()}")
        if replay and seed is None:
            return _err(422, "ValidationError", "'replay' needs a 'seed': replies are replayed after a reset.")
        hidden = server_only_fields(env_class(env_name))
        forbidden = [k for k in config if k in hidden]
        if forbidden:
            k = forbidden[0]
            return _err(422, "ConfigError", f"env '{env_name}' config.{k}: only the server's operator sets this field "
                        "(it names files, modules, simulator processes or sandbox limits); remove it from the config. "
                        f"The operator sets it with `vagent serve-env --env-config {env_name}.{k}=VALUE`.")
        try:
            env = make(env_name, **{**self.env_config.get(env_name, {}), **config})
        except ConfigError as exc:
            return _err(422, "ConfigError", self.redact(str(exc)))
        spec = env_spec(env, hidden)
        digest = config_hash_of(env_name, spec["config"])
        if config_hash is not None and config_hash != digest:
            # a restore (or a new session of a RemoteEnv) must run under the config it started with
            try:
                env.close()
            except Exception:  # noqa: BLE001 - refused either way
                traceback.print_exc()
            return ("err", 409, {"error": "ConfigMismatch", "session_closed": False, "config": spec["config"],
                                 "detail": f"env '{env_name}' resolves to config hash {digest} on this server, not "
                                 f"{config_hash}: this server's operator config (--env-config) differs from the "
                                 "server's the session started on; nothing was created. Restore it on a server "
                                 "configured alike."})
        sess = _Session(env=env, name=env_name)
        self.sessions[sid] = sess
        out: dict[str, Any] = {"session_id": sid, "env": env_name, "solvable": callable(getattr(env, "optimal_actions", None)),
                               "spec": spec, "config_hash": digest}
        if seed is not None:
            try:
                reset = self._reset_payload(env.reset(seed=seed))
                if not replay:
                    out["reset"] = reset
                for i, response in enumerate(replay):
                    res = env.step(response)
                    if i == len(replay) - 1:
                        sess.last = self._step_payload(res)
                        out["last_step"] = sess.last
            except BaseException:
                self._close(sid)  # a failed create leaves no session behind
                raise
            sess.steps = len(replay)
        return ("ok", out)

    def _op_reset(self, sid: str, seed: int) -> Result:
        sess = self.sessions[sid]
        payload = self._reset_payload(sess.env.reset(seed=seed))
        sess.steps, sess.last = 0, None
        return ("ok", payload)

    def _op_step(self, sid: str, response: str, index: int | None) -> Result:
        sess = self.sessions[sid]
        if index is not None and index != sess.steps:
            if index == sess.steps - 1 and sess.last is not None:
                return ("ok", sess.last)  # a retry of a step already applied: answer it again
            return _err(409, "OutOfOrder", f"step index {index} but the session has applied {sess.steps} step(s) "
                        f"since its reset; send index={sess.steps} (or omit it).")
        payload = self._step_payload(sess.env.step(response))
        sess.steps += 1
        sess.last = payload
        return ("ok", payload)

    def _op_system_prompt(self, sid: str) -> Result:
        return ("ok", {"system_prompt": str(self.sessions[sid].env.system_prompt())})

    def _op_state(self, sid: str) -> Result:
        return ("ok", {"state": to_jsonable(self.sessions[sid].env.state())})

    def _op_optimal_actions(self, sid: str) -> Result:
        env = self.sessions[sid].env
        if not hasattr(env, "optimal_actions"):
            return _err(409, "NotSupported", f"env '{self.sessions[sid].name}' has no optimal_actions (no solver).")
        return ("ok", {"actions": [str(a) for a in env.optimal_actions()]})

    def _op_close(self, sid: str) -> Result:
        self._close(sid)
        return ("ok", {"closed": True})

    def _close(self, sid: str) -> None:
        sess = self.sessions.pop(sid, None)
        if sess is not None:
            try:
                sess.env.close()
            except Exception:  # noqa: BLE001 - the session is gone either way; close errors are not rewards
                traceback.print_exc()

    def close_all(self) -> None:
        for sid in list(self.sessions):
            self._close(sid)


def _strings(x: object) -> list[str]:
    """Every string in a config value (nested lists and dicts included)."""
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for v in x.values() for s in _strings(v)]
    if isinstance(x, (list, tuple)):
        return [s for v in x for s in _strings(v)]
    return []


def _unknown(sid: str) -> str:
    return (f"unknown session '{sid[:80]}': it expired (idle TTL), was closed, or the server restarted. "
            "Create a new session (RemoteEnv does this and replays the episode by itself).")


def worker_main(conn_in: Connection, conn_out: Connection, imports: tuple[str, ...], allowed: tuple[str, ...], png_level: int,
                env_config: dict[str, dict[str, Any]], index: int = 0) -> None:
    """Entry point of a worker process: run pickled ``(request_id, ops)`` messages from ``conn_in``
    in order and answer ``(request_id, results)`` on ``conn_out`` (``None`` stops the worker).

    Sets ``VAGENT_WORKER_INDEX`` (0..W-1) before importing plugins, so an env can pick its GPU
    (e.g. ``cuda:{index % torch.cuda.device_count()}``).
    """
    import os
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front process decides when we stop
    os.environ["VAGENT_WORKER_INDEX"] = str(index)
    from vagent.omp import apply_wait_settings

    apply_wait_settings()  # this worker's OpenMP wait choice, for the machine as it is now (before an env loads torch)
    import_plugins(imports)
    host = SessionHost(allowed, png_level, env_config)
    while True:
        try:
            msg = pickle.loads(conn_in.recv_bytes())
        except (EOFError, OSError):
            break
        if msg is None:
            break
        req_id, ops, codec = msg
        conn_out.send_bytes(pickle.dumps((req_id, host.run_many(ops, codec)), protocol=pickle.HIGHEST_PROTOCOL))
    host.close_all()
